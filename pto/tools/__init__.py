"""What the commands do, above the engine: ``pto run`` (:mod:`.run`), ``pto codegen``
(:mod:`.emit`), ``pto estimate`` (:mod:`.estimate`), ``pto graph`` (:mod:`.graphcmd`), ``pto
bench`` (:mod:`.benchcmd`), ``pto tune`` (:mod:`.tune`), Perfetto traces (:mod:`.trace`) and the
figures of ``--plot`` (:mod:`.plotting`). The command line (:mod:`pto.cli`) parses and checks
what the user typed and calls these."""
