"""Randomness per generator (issue 75): which of Python's, NumPy's and torch's generators a call seeds, and which
draws a split or a shuffle of the data from one. A split drawn from a generator no seed set before differs by rank
(each rank trains on another split, and one rank's training samples are another's validation samples); a seed set
the same on every rank makes every rank draw the same augmentation. Pure: names in, sentences out."""
from __future__ import annotations

from typing import Optional, Set

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
    if last in ("manual_seed", "manual_seed_all"):
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
        return NUMPY  # (scikit-learn's random_state=None draws from NumPy's global generator)
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
