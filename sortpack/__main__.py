from sortpack.cli import main

main()
