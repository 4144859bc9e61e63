from runner.cli.commands import main

main()
