"""Shell completion for the `shadowline` command, written from its argparse parser (so a new subcommand or option
completes without an edit here): bash and zsh scripts, each (sub)command's options, the values of options with
choices, and files elsewhere."""

from __future__ import annotations

import argparse


def _words(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """What a (sub)command completes: every option, the options that take one of a few values (option -> values),
    and the values of a positional with choices. Both shells' scripts are written from it."""
    every = sorted(o for action in parser._actions for o in action.option_strings)
    options: dict[str, list[str]] = {}
    positional: list[str] = []
    for action in parser._actions:
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            if action.option_strings:
                options.update({o: [str(c) for c in action.choices] for o in action.option_strings})
            else:
                positional += [str(c) for c in action.choices]
    return every, options, positional


def bash_completion(parser: argparse.ArgumentParser) -> str:
    """A bash completion function from the parser itself: subcommands, then each one's options and files."""
    subcommands = _subparsers(parser)
    cases = []
    for name, sub in subcommands.items():
        options, valued, positional = _words(sub)
        body = [f'opts="{" ".join(options)}"'] + ([f'words="{" ".join(positional)}"'] if positional else [])
        body += [f'[[ "$prev" == {o} ]] && {{ COMPREPLY=($(compgen -W "{" ".join(v)}" -- "$cur")); return; }}'
                 for o, v in sorted(valued.items())]
        cases.append(f'    {name}) {"; ".join(body)} ;;')
    return "\n".join([
        "# bash completion for shadowline: eval \"$(shadowline completion bash)\"",
        "_shadowline() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" opts words=""',
        "  if [ \"$COMP_CWORD\" -eq 1 ]; then",
        f'    COMPREPLY=($(compgen -W "{" ".join(subcommands)} --help --version" -- "$cur")); return',
        "  fi",
        '  case "${COMP_WORDS[1]}" in',
        *cases,
        "    *) opts=\"\" ;;",
        "  esac",
        '  if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "$opts" -- "$cur"));',
        '  elif [ -n "$words" ]; then COMPREPLY=($(compgen -W "$words" -- "$cur"));',
        '  else COMPREPLY=($(compgen -f -- "$cur")); fi',
        "}",
        "complete -o filenames -F _shadowline shadowline",
    ])


def zsh_completion(parser: argparse.ArgumentParser) -> str:
    """A zsh completion function from the parser itself: subcommands with their summaries, then each one's options,
    the values of an option or argument that has choices, and files."""
    subcommands = _subparsers(parser)
    summaries = {a.dest: a.help for a in _subparsers_action(parser)._choices_actions}
    described = " ".join(_zsh_word(f"{name}:{summaries.get(name) or name}") for name in subcommands)
    cases = []
    for name, sub in subcommands.items():
        options, valued, positional = _words(sub)
        body = [f"opts=({' '.join(options)})"] + ([f"words_of=({' '.join(positional)})"] if positional else [])  # not words:
        body += [f"[[ $prev == {o} ]] && {{ compadd -- {' '.join(v)}; return; }}"  # zsh's own array
                 for o, v in sorted(valued.items())]
        cases.append(f"    ({name}) {'; '.join(body)} ;;")
    return "\n".join([
        "#compdef shadowline",
        "# zsh completion for shadowline: after compinit, eval \"$(shadowline completion zsh)\"; or save it as",
        "# _shadowline in a directory of $fpath.",
        "_shadowline() {",
        "  local prev=${words[CURRENT-1]}",
        "  local -a subcommands opts words_of",
        f"  subcommands=({described})",
        "  if (( CURRENT == 2 )); then",
        "    if [[ $PREFIX == -* ]]; then compadd -- --help --version; else _describe -t commands command subcommands; fi",
        "    return",
        "  fi",
        "  case ${words[2]} in",
        *cases,
        "    (*) opts=() ;;",
        "  esac",
        "  if [[ $PREFIX == -* ]]; then compadd -- $opts",
        "  elif (( ${#words_of} )); then compadd -- $words_of",
        "  else _files; fi",
        "}",
        "if (( $+functions[compdef] )); then compdef _shadowline shadowline; fi",
    ])


def _zsh_word(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = _subparsers_action(parser)
    return dict(action.choices) if action else {}


def _subparsers_action(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
