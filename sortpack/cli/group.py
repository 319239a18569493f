"""The ``sortpack`` click group; each command file adds its command to it, loaded when the command is asked for."""
from __future__ import annotations

import importlib

import click

# each command -> the module of this package that adds it to the group: a job loads its own command (and the
# options it reads), not the other six; ``--help`` lists them all
COMMANDS = {name: name for name in ("analyze", "export", "inspect", "pack", "run", "sort", "verify")}


class CommandGroup(click.Group):
    """A click group whose commands load from their modules (``COMMANDS``) when first asked for."""

    def list_commands(self, ctx: click.Context | None) -> list[str]:
        """Return every command's name, sorted, loaded or not."""
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        """Return the command ``cmd_name``, loading its module first (None: no such command)."""
        if cmd_name not in self.commands:
            # a name that is no command loads them all: click suggests the nearest of those the group holds
            for module in [COMMANDS[cmd_name]] if cmd_name in COMMANDS else COMMANDS.values():
                importlib.import_module(f"{__package__}.{module}")
        return self.commands.get(cmd_name)


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sortpack")
def cli():
    """Sort variable-length datasets by size and pack them into token-budgeted micro-batches.

    Every command runs as one process or under mpiexec/srun with any number of ranks and
    writes byte-identical data either way.
    """
