"""Command-line entry points: topoctl and its subcommands."""
