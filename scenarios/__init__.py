"""The scenarios shipped with zsim (package data `zsim.scenarios`; `zsim profiles` lists them)."""
