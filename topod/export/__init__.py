"""Exports of the host model for other systems, each a pure function of the Topology.

- nrt:     Kubernetes NodeResourceTopology (topology.node.k8s.io/v1alpha2) as a dict
- slurm:   Slurm gres.conf lines (Name=gpu Type= File= Cores= Links=)
- nccl:    an NCCL topology XML (NCCL_TOPO_FILE), whole host or one lease's GPUs
- labels:  the validated [cluster] labels (rack, leaf, ...) carried into NRT attributes
- metrics: Prometheus exposition text from a daemon snapshot (own registry, no globals)

Nothing here reads the host; the CLI (topod/cli/export_cmd.py) and the daemon do the I/O.
"""
