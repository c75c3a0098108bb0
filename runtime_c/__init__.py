"""The PTO C runtime: its C sources and headers, and ``build_runtime`` listing them (installed as
``pto.runtime_c``)."""
