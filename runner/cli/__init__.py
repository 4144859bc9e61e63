"""The command line: `runner` and its commands (runner.cli.commands), and how the terminal shows
what they print (runner.cli.terminal)."""
