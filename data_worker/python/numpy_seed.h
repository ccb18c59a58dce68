// numpy's PCG64(seed) state, computed in C++: the python op sends each
// element's generator as this state instead of a seed, so that the Python
// process sets it on one reused bit generator (about 1 us) instead of building
// numpy.random.Generator(numpy.random.PCG64(seed)) per element (about 25 us:
// numpy's SeedSequence hashing runs in Python-level code).
//
// The stream is numpy's, bit for bit: PCG64(seed) seeds through
// SeedSequence(seed) (numpy/random/bit_generator.pyx: entropy = the seed's
// 32-bit words, low first; a pool of 4 words mixed with hashmix/mix; 8 words
// generated, read as 4 little-endian uint64 v[0..3]), then
// pcg_setseq_128_srandom_r(initstate = v[0]:v[1], initseq = v[2]:v[3]) (high
// word first). numpy_seed_test compares with numpy's own PCG64(seed).state.
//
//   Pcg64State s = NumpyPcg64State(0);
//   // s.state == 0x1aa1b5345996452d09585eb7a69561e3, as
//   // numpy.random.PCG64(0).state["state"]["state"]
#ifndef SLUICE_DATA_WORKER_PYTHON_NUMPY_SEED_H_
#define SLUICE_DATA_WORKER_PYTHON_NUMPY_SEED_H_

#include <cstdint>
#include <string>

namespace sluice::data_worker::python {

// A PCG64 bit generator's state (numpy's bit_generator.state["state"]).
struct Pcg64State {
  unsigned __int128 state = 0;
  unsigned __int128 inc = 0;
};

// The state of numpy.random.PCG64(seed) right after construction.
Pcg64State NumpyPcg64State(uint64_t seed);

// 32 lowercase hex digits (Python: int(text, 16)).
std::string Hex128(unsigned __int128 v);

}  // namespace sluice::data_worker::python

#endif  // SLUICE_DATA_WORKER_PYTHON_NUMPY_SEED_H_
