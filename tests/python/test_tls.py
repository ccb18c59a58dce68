"""sluice.TLS against a real cluster with mutual TLS and a token (`sluice local --tls`): the
server name the client verifies instead of the host it dials (TLS.server_name)."""
import pytest

import sluice
from conftest import SPLIT_SIZE, start_cluster, stop_cluster


@pytest.fixture(scope="module")
def tls_cluster(work, dataset):
    proc, address, log = start_cluster(work, "tls-cluster", "--tls")
    tls = work / "tls-cluster" / "tls"
    yield address, dict(ca=str(tls / "ca.pem"), cert=str(tls / "client.pem"),
                        key=str(tls / "client.key"), token_file=str(tls / "token"))
    stop_cluster(proc, log)


def test_a_server_name_the_certificates_carry_is_accepted(tls_cluster, dataset, spec_file, job):
    address, files = tls_cluster
    # The throwaway certificates name 127.0.0.1 and localhost; the cluster is dialled at
    # 127.0.0.1 and the workers at their addresses: all are checked against "localhost".
    client = sluice.Client(address, tls=sluice.TLS(**files, server_name="localhost"))
    ids = []
    with client.open(spec_file, data=dataset, job=job, split_size=SPLIT_SIZE) as it:
        for batch in it:
            ids.extend(batch["index"].tolist())
    assert len(ids) == len(set(ids)) > 0


def test_a_server_name_they_do_not_carry_is_refused_naming_it(tls_cluster):
    address, files = tls_cluster
    with pytest.raises(sluice.Unavailable, match="sluice.example"):
        sluice.Client(address, timeout=5, tls=sluice.TLS(**files, server_name="sluice.example"))
