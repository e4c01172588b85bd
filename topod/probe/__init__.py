"""Link validation: measure links with small and large transfers, compare with the model,
correct what firmware got wrong, and weigh degraded links in the distance model.

  backend.py    the probe interface and its values (LinkId, ProbeResult, Measurement)
  hostmem.py    CPU node <-> memory node copies (libnuma/mbind through ctypes)
  cuda.py       pinned host <-> GPU and GPU <-> GPU copies (cuda-python, optional)
  simulated.py  a ground-truth link table, for tests and demos
  linkstate.py  EWMA + median/MAD per link, job telemetry, DistanceModel corrections
  calibrate.py  measured locality and degraded pairs -> corrected Topology + findings
  sampler.py    when to probe and which links, within a share of wall time

Nothing heavy is imported here; the CUDA bindings load only when that backend opens.
"""
