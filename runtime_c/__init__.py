"""The PTO C runtime sources and their cffi build script (installed as ``pto.runtime_c``)."""
