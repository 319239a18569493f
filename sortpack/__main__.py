from sortpack.write import termination

termination.install()  # first: a Ctrl-C while the command line loads is one line, not a traceback

from sortpack.cli import main  # noqa: E402

main()
