"""The IR: dtypes, the op vocabulary, scalar expressions, nodes and derived facts."""
