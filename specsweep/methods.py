"""Methods: the configured methods expanded (sweeps over budget and top-k) into what a server runs.

Each method becomes its algorithm, parameters, server flags and environment, with the algorithm's spelling
(``algorithms``: DDTree lives in SGLang forks with differing flags) and placeholders substituted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from . import ddtree
from .canon import canonical_json
from .config import ConfigError

SPECULATIVE = ("dflash", "ddtree")


@dataclass(frozen=True)
class Method:
    """One decoding method as a server runs it: algorithm, parameters, flags, environment."""

    name: str
    algorithm: str
    params: dict  # block_size, budget, topk where they apply
    flags: tuple  # server flags (argument list), substituted; --attention-backend included when set
    env: dict  # environment variables, substituted
    attention_backend: str | None = None  # None: the server's own default (fa3 on Hopper for SGLang)
    min_free_slots_delay: str | int | None = None  # None: server.min_free_slots_delay

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "algorithm": self.algorithm,
            "params": dict(self.params),
            "flags": list(self.flags),
            "env": dict(self.env),
            "attention_backend": self.attention_backend,
            "min_free_slots_delay": self.min_free_slots_delay,
        }


def _substitute(template: str, values: dict, where: str) -> str:
    try:
        return template.format(**values)
    except KeyError as exc:
        raise ConfigError(
            f"{where}: placeholder {{{exc.args[0]}}} is not defined for this method; "
            f"known placeholders: {', '.join('{' + k + '}' for k in sorted(values))}"
        ) from None


# What method expansion reads from a configuration; each distinct one is expanded once per process.
EXPANSION_KEYS = ("methods", "defaults", "algorithms", "match_ddtree_scheduling", "match_ddtree_attention")


def expand_methods(config: dict) -> list[Method]:
    """Expand the configured methods (sweeps over budget/topk) into concrete methods (once per distinct
    configuration: every server job, cell table and check asks again)."""
    key = canonical_json({**{k: config.get(k) for k in EXPANSION_KEYS}, "drafter": config["model"].get("drafter", "")})
    if key not in _EXPANDED:
        _EXPANDED[key] = tuple(_expand(config))
    return list(_EXPANDED[key])


_EXPANDED: dict[str, tuple[Method, ...]] = {}


def _expand(config: dict) -> list[Method]:
    defaults = config.get("defaults", {})
    spellings = config["algorithms"]
    drafter = config["model"].get("drafter", "")
    methods: list[Method] = []
    for index, entry in enumerate(config["methods"]):
        algorithm = entry["algorithm"]
        where = f"methods[{index}] ({entry['name']})"
        if algorithm == "ar":
            for key in ("block_size", "budget", "topk", "tree_build"):
                if key in entry:
                    raise ConfigError(f"{where}: '{key}' has no meaning for algorithm 'ar'; remove it")
            grid = [{}]
        else:
            if algorithm == "dflash":
                for key in ("budget", "topk"):
                    if key in entry:
                        raise ConfigError(
                            f"{where}: '{key}' has no meaning for algorithm 'dflash' (a linear chain); "
                            "use algorithm 'ddtree' for a draft tree"
                        )
            block = entry.get("block_size", defaults.get("block_size", 16))
            axes: dict[str, list] = {"block_size": [block]}
            if algorithm != "ddtree" and "tree_build" in entry:
                raise ConfigError(f"{where}: 'tree_build' has no meaning for algorithm '{algorithm}'; remove it")
            if algorithm == "ddtree":
                try:
                    axes["tree_build"] = [ddtree.build(entry.get("tree_build")).name]
                except ValueError as exc:
                    raise ConfigError(f"{where}.tree_build: {exc}") from None
                if "budget" not in entry:
                    raise ConfigError(f"{where}: algorithm 'ddtree' needs 'budget' (an integer or a list to sweep)")
                for key, default in (("budget", None), ("topk", defaults.get("topk", 8))):
                    value = entry.get(key, default)
                    axes[key] = value if isinstance(value, list) else [value]
            grid = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
        swept = [k for k in ("budget", "topk") if isinstance(entry.get(k), list)]
        spelling = spellings.get(algorithm, {"flags": [], "env": {}})
        for params in grid:
            name = entry["name"] + "".join(f"-{k[0]}{params[k]}" for k in swept)
            values = {"drafter": drafter, **{k: str(v) for k, v in params.items()}}
            if "block_size" in params:
                values["draft_tokens"] = str(params["block_size"] - 1)
            mwhere = f"{where} algorithms.{algorithm}"
            flags = [_substitute(f, values, mwhere + ".flags") for f in spelling.get("flags", [])]
            flags += [_substitute(str(f), values, where + ".flags") for f in entry.get("flags", [])]
            if algorithm == "dflash" and config.get("match_ddtree_scheduling") and "--disable-overlap-schedule" not in flags:
                flags.append("--disable-overlap-schedule")
            backend = _attention_backend(config, entry, algorithm, params, flags, where)
            env = {k: _substitute(str(v), values, mwhere + ".env") for k, v in spelling.get("env", {}).items()}
            env.update({k: _substitute(str(v), values, where + ".env") for k, v in entry.get("env", {}).items()})
            if algorithm == "ddtree":
                try:
                    ddtree.with_environment(ddtree.build(params["tree_build"]), env)
                except ValueError as exc:
                    raise ConfigError(f"{where}.env: {exc}") from None
            methods.append(Method(name, algorithm, params, tuple(flags), env, backend,
                                  entry.get("min_free_slots_delay")))
    seen: dict[str, int] = {}
    for method in methods:
        if method.name in seen:
            raise ConfigError(
                f"methods: duplicated method name '{method.name}' (after expanding sweeps); "
                "give each method a unique name"
            )
        seen[method.name] = 1
    return methods


def _attention_backend(config: dict, entry: dict, algorithm: str, params: dict, flags: list, where: str) -> str | None:
    """The method's attention backend, appended to ``flags`` as --attention-backend when one is set.

    The method's own ``attention_backend`` (or an --attention-backend in its flags) wins; then, with
    ``match_ddtree_attention``, the DDTree spelling's backend for every method; then the algorithm's spelling;
    else None (the server's default). A DDTree tree budget (budget > block_size - 1) on another backend than
    its spelling requires is refused: the pull request's build does not start so.
    """
    spellings = config["algorithms"]
    if "--attention-backend" in flags:
        given = flags[flags.index("--attention-backend") + 1] if flags.index("--attention-backend") + 1 < len(flags) else None
        if entry.get("attention_backend") and entry["attention_backend"] != given:
            raise ConfigError(f"{where}: attention_backend '{entry['attention_backend']}' disagrees with "
                              f"--attention-backend {given} in its flags; keep one")
        backend = given
    else:
        backend = (entry.get("attention_backend")
                   or (spellings.get("ddtree", {}).get("attention_backend") if config.get("match_ddtree_attention") else None)
                   or spellings.get(algorithm, {}).get("attention_backend"))
        if backend:
            flags += ["--attention-backend", backend]
    required = spellings.get("ddtree", {}).get("attention_backend")
    if (algorithm == "ddtree" and required and backend != required
            and params.get("budget", 0) > params.get("block_size", 16) - 1):
        raise ConfigError(
            f"{where}: DDTree budget {params['budget']} builds a tree (budget > block_size - 1 = "
            f"{params['block_size'] - 1}), which this build verifies only with {required} attention "
            f"(algorithms.ddtree.attention_backend); remove attention_backend '{backend}' from the method")
    return backend
