"""`make test-gpu`: topod's view of a real GPU server against the vendor's own tools
(`nvidia-smi topo -m`, `rocm-smi --showtopo`). smi_text parses their output, compare
judges it against a Topology, __main__ is the shell an operator runs."""
