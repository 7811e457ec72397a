"""Pass infrastructure: pass registry, pipelines, decompositions and graph optimizations (issue 4)."""
