"""The layer that builds a validated Scenario from a scenario file: it reads the file (zsim.config), then
cross-checks it against the domain (the cluster, the layout, the workload, the ZeRO model states), which
zsim.config, at the bottom of the import graph, may not import (docs/architecture.md)."""
