"""What readers see: result tables (the same cells on the CLI and the site), the docs pages' macros,
the figure style, the compile and workload reports, the home page's progression."""
