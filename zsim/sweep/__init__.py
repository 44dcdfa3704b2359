"""`zsim sweep`: what-if studies over any scenario key (docs/sweep.md)."""
