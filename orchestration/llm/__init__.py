"""The text-generation application (``pto generate``)."""
