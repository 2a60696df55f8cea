"""Studies built on many searches: what-if across clusters and knobs (``whatif``), the fewest
devices that fit (``fit``) and the comparison with published runs (``validate``)."""
