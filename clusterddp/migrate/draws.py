"""Randomness per generator (issue 75): which of Python's, NumPy's and torch's generators a call seeds, and which
draws a split or a shuffle of the data from one. A split drawn from a generator no seed was set for differs by rank
(each rank trains on another split, and one rank's training samples are another's validation samples); a seed set
the same on every rank makes every rank draw the same augmentation."""
from __future__ import annotations

from typing import Any, Optional, Set

PYTHON, NUMPY, TORCH = "Python's random", "NumPy's global generator", "torch's generator"
#: a seed for every generator at once (Lightning's, Hugging Face's, and the scripts' own helpers of those names)
SEED_ALL = ("seed_everything", "set_seed", "seed_all", "fix_seed", "set_random_seed")
HOW = {PYTHON: "random.seed(0)", NUMPY: "np.random.seed(0)", TORCH: "torch.manual_seed(0)"}


def seeds(name: str) -> Set[str]:
    """The generators the call ``name`` seeds (dotted, as written)."""
    last = name.split(".")[-1]
    if last in SEED_ALL:
        return {PYTHON, NUMPY, TORCH}
    if name == "random.seed":
        return {PYTHON}
    if name in ("np.random.seed", "numpy.random.seed"):
        return {NUMPY}
    if name == "torch.manual_seed":  # (torch.cuda's seeds only the GPUs'; a private Generator's only its own)
        return {TORCH}
    return set()


def drawn_from(name: str, has_generator: bool, has_random_state: bool) -> Optional[str]:
    """The generator a split or shuffle of data drawn by ``name`` comes from; None for anything else (or where the
    call is given a generator or a random_state of its own)."""
    last = name.split(".")[-1]
    if name in ("random.shuffle", "random.sample"):
        return PYTHON
    if name.split(".")[:-1] in (["np", "random"], ["numpy", "random"]) and last in ("permutation", "shuffle",
                                                                                     "choice"):
        return NUMPY
    if last in ("train_test_split", "KFold", "StratifiedKFold", "ShuffleSplit") and not has_random_state:
        return NUMPY  # (scikit-learn's random_state=None, or a name that may hold it, draws from NumPy's global one)
    if last in ("randperm", "random_split") and not has_generator:
        return TORCH
    return None


def unseeded(call: str, generator: str, seeded: Set[str]) -> Optional[str]:
    """The finding for a split drawn by ``call`` from ``generator``, where no seed of it was set before."""
    if generator in seeded:
        return None
    other = f" (the seeds set before it are {', '.join(sorted(seeded))}'s: not this one)" if seeded else ""
    return (f"{call} draws from {generator} with no seed set before it{other}: each rank draws its own split or "
            "order, so one rank's training samples are another's validation samples (or the ranks' shares overlap); "
            f"seed it the same on every rank first ({HOW[generator]}" +
            (", or generator=torch.Generator().manual_seed(0))" if generator == TORCH else
             ", or random_state=0)" if call.split(".")[-1] in ("train_test_split", "KFold", "StratifiedKFold",
                                                               "ShuffleSplit") else
             ")"))


def same_seed(generators: Set[str]) -> str:
    """The finding at a seed set the same on every rank."""
    return (f"the same seed on every rank ({', '.join(sorted(generators))}): right for the model's initial weights "
            "and a split every rank must draw alike; where augmentation or dropout draws from it, every rank draws "
            "the same numbers: for per-rank randomness add runtime.rank() to the seed after the split")


def fixed_state(call: Any) -> bool:
    """``random_state=`` given as a number (a name such as ``args.seed`` may hold None, NumPy's global generator)."""
    from .syntax import keyword, libcst_module

    given = keyword(call, "random_state")
    return given is not None and isinstance(given.value, libcst_module().Integer)


def fresh_generator(call: Any) -> str:
    """The finding for a generator made with no seed (``np.random.RandomState()``, ``np.random.default_rng()``,
    ``random.Random()``, or given None): seeded from the operating system, another on every rank ('' otherwise)."""
    from .syntax import dotted, positional

    name = dotted(call.func)
    if name.split(".")[-1] not in ("RandomState", "default_rng", "Random") or \
            name.split(".")[0] not in ("np", "numpy", "random"):
        return ""
    given = positional(call) + [a for a in call.args if a.keyword is not None and a.keyword.value == "seed"]
    if given and not (code_of_value(given[0]) == "None"):
        return ""
    return (f"{name}() with no seed: a generator seeded from the operating system, another on every rank; where it "
            "draws a split or the order of the data, each rank trains on another split (one rank's training samples "
            "are another's validation samples); give it the same seed on every rank")


def code_of_value(arg: Any) -> str:
    from .syntax import code_of

    return code_of(arg.value).strip()
