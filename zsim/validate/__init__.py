"""Validation suites (`zsim validate <suite>`): each module runs one and judges it against criteria."""
