"""The hardware profiles shipped with zsim (package data `zsim.hwprofiles`; docs/profiles.md)."""
