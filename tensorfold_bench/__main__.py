from tensorfold_bench.cli.commands import main

try:
    main()
finally:
    # Under `python -m`, CPython exits by SIGINT instead of with main's code once a
    # KeyboardInterrupt has escaped an exec() of source text (a dataclass or namedtuple being
    # defined by a lazy import when Ctrl-C came), even though main caught it and chose 130;
    # a clean exec of source text clears that mark.
    exec("pass")
