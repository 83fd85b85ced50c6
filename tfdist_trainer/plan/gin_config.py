"""Loading the user's gin configuration and the modules it names, with errors a user can act on."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import tokenize
from collections.abc import Sequence
from typing import Any

import gin

from tfdist_trainer.errors import ConfigError

# The gin files the package ships (tfdist_trainer/configs/strategies/*.gin, in the wheel): a
# --gin_file or an `include` names them relative to this directory, e.g. 'strategies/mirrored.gin',
# from any working directory. Gin tries a relative path against the working directory first
# (its first search prefix is ''), so a user's own file of the same relative name wins.
PACKAGE_CONFIGS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"
)


_search_path_added = False


def add_package_configs_to_gin_search_path() -> None:
    """Lets gin find the package's gin files by name (once per process: gin keeps its list)."""
    global _search_path_added
    if not _search_path_added:
        gin.add_config_file_search_path(PACKAGE_CONFIGS_DIR)
        _search_path_added = True


class _QuietGinResourceProbe(logging.Filter):
    """Drops gin's 'Path not found' ERROR for a relative name it also tries as a Python package.

    For every relative path gin probes each search prefix with each file reader; its package-resource
    reader logs an ERROR on the root logger whenever the path's head is no importable package, which
    is every `include 'strategies/x.gin'` found under the package's configs. A file found nowhere
    still fails, as one ConfigError sentence.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.msg == "Path not found: %s"
            and os.path.basename(record.pathname) == "resource_reader.py"
        )


def find_gin_file(path: str) -> str | None:
    """Where gin will read --gin_file `path` from: the working directory, else the package's configs."""
    if os.path.isfile(path):
        return path
    if not os.path.isabs(path):
        packaged = os.path.join(PACKAGE_CONFIGS_DIR, path)
        if os.path.isfile(packaged):
            return packaged
    return None


def import_modules(modules: Sequence[str]) -> None:
    """Imports user modules (``--module my_project.trainers``) from the working directory."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(
                f"--module {name} could not be imported ({e}); check the name and PYTHONPATH."
            ) from None


def check_gin_files(gin_files: Sequence[str]) -> None:
    """Names a missing --gin_file before TensorFlow is imported (a typo should not cost seconds)."""
    for path in gin_files:
        if find_gin_file(path) is None:
            raise ConfigError(
                f"gin file {path} does not exist; check the --gin_file path"
                f" (the package's own are {_packaged_names()})."
            )


def _packaged_names() -> str:
    """The package's gin files as a --gin_file or include names them ('strategies/x.gin', ...)."""
    names = []
    for root, _, files in os.walk(PACKAGE_CONFIGS_DIR):
        rel = os.path.relpath(root, PACKAGE_CONFIGS_DIR)
        names += [os.path.normpath(os.path.join(rel, f)) for f in files if f.endswith(".gin")]
    return ", ".join(sorted(names)) or "none"


def _gin_problem(e: BaseException, gin_bindings: Sequence[str] = ()) -> str:
    """Gin's error as one line: its first line plus the statement and place it names on the next ones."""
    if isinstance(e, tokenize.TokenError):  # an unclosed bracket or quote; gin does not wrap it
        return f"{e.args[0]} (an unclosed bracket or quote?)"
    if isinstance(e, SyntaxError):
        text = (e.text or "").strip()
        if e.filename:
            where = f"file {e.filename}, line {e.lineno}"
        else:  # gin parses the bindings joined by newlines, so the line is the binding's number
            where = f"--gin_bindings line {e.lineno}"
            if not text and e.lineno and 0 < e.lineno <= len(gin_bindings):
                text = gin_bindings[e.lineno - 1].strip()
        return f"{(e.msg or 'syntax error').rstrip('.')}{f' in `{text}`' if text else ''} ({where})"
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    message = lines[0].rstrip(".") if lines else type(e).__name__
    # '  In file "x.gin", line 3' then the statement
    if len(lines) >= 3 and lines[1].startswith("In "):
        message += f" in `{lines[2]}` ({lines[1][3:]})"
    return message


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str]) -> None:
    """Parses gin files then bindings; unknown names and missing files end in one sentence."""
    check_gin_files(gin_files)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    gin.clear_config()
    add_package_configs_to_gin_search_path()
    quiet = _QuietGinResourceProbe()
    logging.getLogger().addFilter(quiet)
    try:
        gin.parse_config_files_and_bindings(
            list(gin_files), list(gin_bindings), finalize_config=False
        )
    except ImportError as e:
        raise ConfigError(
            f"a gin 'import' failed ({_gin_problem(e)}); make the module importable from the working directory or PYTHONPATH."
        ) from None
    except (ValueError, KeyError, SyntaxError, tokenize.TokenError) as e:
        raise ConfigError(
            f"bad gin configuration: {_gin_problem(e, gin_bindings)}; fix the binding or the --gin_file."
        ) from None
    except OSError as e:
        raise ConfigError(
            f"gin include could not be read ({_gin_problem(e)}); check the include path"
            f" (the package's own are {_packaged_names()})."
        ) from None
    finally:
        logging.getLogger().removeFilter(quiet)


def load_experiment(
    gin_files: Sequence[str],
    gin_bindings: Sequence[str],
    modules: Sequence[str] = (),
    **overrides: Any,
):
    """Imports, parses and builds the gin-configured Experiment (``train.*``).

    `overrides` are Experiment arguments given in Python (the Python entry
    point's `trainer_cls`); they win over gin. The Trainer's own bindings are
    checked here too, so that `tfdist-launch`, `tfdist-train` and `train(...)`
    refuse a misspelt one before any task starts.
    """
    check_gin_files(gin_files)
    # Registers the package's own configurables (strategies, Trainer) before parsing.
    from tfdist_trainer.plan import experiment
    from tfdist_trainer.plan.trainer_bindings import check_trainer_bindings

    import_modules(modules)
    parse_gin(gin_files, gin_bindings)
    try:
        loaded = experiment.Experiment(**overrides)
    except (ValueError, TypeError) as e:
        message = str(e).strip().splitlines()[0]
        raise ConfigError(message) from None
    check_trainer_bindings(loaded.trainer_cls)
    return loaded


#: What asks for the program's own --help (--helpfull stays absl's).
_HELP_ARGS = {"--help", "-help", "--helpshort", "-helpshort", "-h", "-?"}


def one_line_flags_parser(
    program: str,
    exit_code: int = 2,
    *,
    usage: str = "",
    groups: Sequence[tuple[str, Sequence[str]]] = (),
    examples: Sequence[str] = (),
):
    """absl's flag parser, except that a bad flag is one line and `exit_code` (absl prints two and
    exits 1), and that --help (-h, -?, --helpshort) lists the program's own flags and exits 0.

    The help has `usage`, then `groups`: (title, flag names) pairs, one line per flag (its
    default and the first sentence of its help); a flag of the same modules in no group (a
    new one) is listed under "other", an `Internal:` one never. Then the `examples`, and a
    pointer to --helpfull, which stays absl's (every flag of every module). Only the
    arguments before a `--` are the program's own: after it, --help is a task's.
    """
    from absl import flags

    def parse(argv: list[str]) -> list[str]:
        own = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
        if groups and _HELP_ARGS.intersection(own):
            _print_help_and_exit(_short_help(usage, groups, examples))
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            print(
                f"[{program}] error: {e}; see --help for the flags.",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(exit_code)

    return parse


def _print_help_and_exit(text: str) -> None:
    """Prints the help and exits 0, quietly when the reader has gone (`--help | head`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `--help | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


def _short_help(
    usage: str, groups: Sequence[tuple[str, Sequence[str]]], examples: Sequence[str]
) -> str:
    """The program's --help: `usage`, one aligned line per flag under its group's title, the
    `examples`, and the pointer to --helpfull."""
    from absl import flags

    other = _ungrouped_flags(groups)
    sections = [*groups, *([("other", other)] if other else [])]
    rows = [
        (title, [_flag_line(flags.FLAGS[name]) for name in names if name in flags.FLAGS])
        for title, names in sections
    ]
    width = min(32, max((len(n) for _, lines in rows for n, _ in lines), default=0))
    out = [usage.strip(), ""]
    for title, lines in rows:
        out.append(f"{title}:")
        for name, text in lines:
            pad = " " * (width - len(name)) if len(name) <= width else "\n" + " " * (width + 4)
            out.append(f"  {name}{pad}  {text}")
        out.append("")
    if examples:
        out += ["examples:", *(f"  {e}" for e in examples), ""]
    out.append("--helpfull: every flag (absl's), with its whole help.")
    return "\n".join(out)


def _ungrouped_flags(groups: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The flags of the grouped flags' modules that no group lists (a flag added since), so that
    --help never hides one; aliases and `Internal:` flags stay out."""
    from absl import flags

    listed = {name for _, names in groups for name in names}
    modules = {flags.FLAGS.find_module_defining_flag(name) for name in listed}
    return [
        flag.name
        for module in sorted(m for m in modules if m)
        for flag in flags.FLAGS.flags_by_module_dict().get(module, [])
        if flag.name not in listed and not flag.help.startswith(("Alias for --", "Internal:"))
    ]


def _flag_line(flag) -> tuple[str, str]:
    """One flag's --help line: its name with its default, and the first sentence of its help
    (with an enum's values), without absl's additions."""
    name = f"--{flag.name}"
    if flag.flag_type() == "bool":
        name = f"--[no]{flag.name}" if flag.default else name
    elif flag.default not in (None, "", []):
        default = flag.default
        if isinstance(default, list):
            name += "=" + ",".join(map(str, default))
        else:
            name += f"={default:g}" if isinstance(default, float) else f"={default}"
    else:
        name += "=..."
    # absl's additions: an enum's "<a|b>: " in front, a multi flag's "; repeat this option ...".
    text = re.sub(r"^<[^>]*>: |;\s*repeat this option to specify a list of values$", "", flag.help)
    text = " ".join(text.split())
    # The first sentence: up to the first '. ' that does not end an abbreviation (e.g., i.e.).
    sentence = re.match(r"(.*?(?<!e\.g)(?<!i\.e)\.)(?:\s|$)", text)
    text = sentence.group(1) if sentence else text
    values = getattr(flag.parser, "enum_values", None)
    return name, f"{text} [{'|'.join(values)}]" if values else text
