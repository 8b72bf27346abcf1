"""Report models: each report's content as typed objects, computed once, that renderers only format."""
