# A worker image that runs python ops (docs/python.md, "Python transforms"): the sluice image,
# plus Debian 12's python3 and numpy (the interpreter sluice is built against: a worker started
# with --allow-python-ops checks at start-up that it imports numpy, and refuses to start
# otherwise), plus the team's packages and its transforms. Build it from the repository root,
# after the sluice image:
#
#   podman build -f deploy/image/python-ops.Dockerfile \
#     --build-arg SLUICE_IMAGE=localhost/sluice:dev -t localhost/sluice-python-ops:dev .
#
# and run it with deploy/kubernetes/components/python-ops (which turns python ops on and names
# the modules workers may run). A team's own image is this file with its packages in the
# apt-get line (python3-scipy, ...; or `pip install --target /opt/sluice/python` from its own
# index) and its modules in the COPY line.
ARG SLUICE_IMAGE=localhost/sluice:dev
FROM ${SLUICE_IMAGE}
# The sluice image runs as uid 10001; packages need root, the worker does not.
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-numpy python3-pil \
 && rm -rf /var/lib/apt/lists/*
# The transforms (here the repository's examples), compiled now: the root filesystem is
# read-only in the pod, so Python could not write its cache there.
COPY examples/python_transforms/*.py /opt/sluice/python/
RUN python3 -m compileall -q /opt/sluice/python \
 && python3 -c "import sys; sys.path[:0] = ['/opt/sluice/python']; \
import numpy, augment_numpy, augment_pil, augment_lut"
USER 10001:10001
