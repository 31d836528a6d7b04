"""The first LibCST pass of ``clusterddp migrate``: what is there (the names the DataParallel model, the optimizers
and the loaders are bound to) and what to list. Imports libcst at module level (loaded by ``transform``)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import PositionProvider

from .draws import drawn_from, fixed_state, fresh_generator, same_seed, seeds, unseeded
from .loaders import Uses, divided_wrongly, phases_in_one_call
from .syntax import code_of, dotted, is_loader, keyword, training_loader

Lines = List[Tuple[int, str]]


def line_of(visitor: Any, node: Any) -> int:
    return int(visitor.get_metadata(PositionProvider, node).start.line)


class Survey(cst.CSTVisitor):
    """What is there: the names the DataParallel model and the optimizers are bound to, and what to look at."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, uses: Optional[Uses] = None) -> None:
        self.uses = uses if uses is not None else Uses()  # loaders by use (loaders.py): dicts, builders, sums
        self.wrapped: Set[str] = set()
        self.optimizers: Set[str] = set()
        self.optimizer_kinds: Set[str] = set()  # names imported from torch.optim
        self.schedulers: Set[str] = set()  # names bound to a learning-rate scheduler
        self.scheduler_kinds: Set[str] = set()  # names imported from torch.optim.lr_scheduler
        self.findings: Lines = []
        self.loops = 0
        self.trains: Set[int] = set()  # the DataLoader calls that train (by the name they are bound to)
        self.dp_names: Set[str] = {"DataParallel"}  # what DataParallel is called here ("as DP" too)
        self.dp_functions: Set[str] = set()  # torch's functional data_parallel, imported by a bare name
        self.bound: Dict[int, Tuple[Any, int, Set[str]]] = {}  # a DataLoader call -> (it, its line, its names)
        self.iterated: Dict[str, bool] = {}  # a name looped over -> whether any such loop runs a backward
        self.evaluation: Set[int] = set()  # shuffled loaders that only evaluate: left as they are
        self.unshuffled: Set[int] = set()  # loaders without shuffle that train (a loop with a backward goes over)
        self.depth = 0  # the loops around the node visited
        self.sizes: List[Tuple[int, str]] = []  # len(X.dataset): (line, X)
        self.lengths: List[Tuple[int, str]] = []  # len(X): (line, X)
        self.wraps: List[int] = []  # the lines of the DataParallel wraps
        self.seeded: Set[str] = set()  # the generators a seed was set for (in the order of the file): draws.py
        self.bars: Set[int] = set()  # tqdm calls a for loop goes over (its own methods work with disable=True)
        self.named_bars: Dict[str, cst.Call] = {}  # bar = tqdm(loader): the name -> the call
        # A loader passed to a function of the script (evaluate(model, val_loader)) is looped over where that
        # function loops over its parameter: its parameters, the loops over them, the calls with names.
        self.params: Dict[str, List[str]] = {}
        self.within: List[str] = []
        self.param_loops: Dict[Tuple[str, str], bool] = {}
        self.calls: List[Tuple[str, List[Tuple[Optional[int], Optional[str], str]]]] = []
        self.key_aliases: List[Tuple[str, str]] = []  # (a parameter's "D[k]", the caller's): one dict of loaders
        self.dict_args: List[Tuple[str, str]] = []  # (a parameter, the name a call gives it)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        """``from torch.optim import RMSprop``: what those names make is an optimizer."""
        module = dotted(node.module) if node.module is not None else ""
        if module.split(".")[:2] in (["torch", "optim"], ["optim"]) and not isinstance(node.names, cst.ImportStar):
            made = {a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else dotted(a.name)
                    for a in node.names}
            if "lr_scheduler" in module:
                self.scheduler_kinds |= made
            else:
                self.optimizer_kinds |= made

    def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
        module = dotted(original_node.module) if original_node.module is not None else ""
        if module.endswith("nn.parallel") and not isinstance(original_node.names, cst.ImportStar):
            self.dp_functions |= {a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else
                                  dotted(a.name) for a in original_node.names if dotted(a.name) == "data_parallel"}

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if dotted(node.name).split(".")[-1] == "DataParallel" and node.asname is not None and \
                isinstance(node.asname.name, cst.Name):
            self.dp_names.add(node.asname.name.value)

    def is_dp(self, call: cst.Call) -> bool:
        return dotted(call.func).split(".")[-1] in self.dp_names

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        names = {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
        if isinstance(value, cst.Call) and dotted(value.func).split(".")[-1] == "tqdm":
            self.named_bars.update({n: value for n in names})
        inner = module_of(value)  # (nn.DataParallel(model).to(device): the module methods return the module)
        if isinstance(inner, cst.Call) and self.is_dp(inner):
            self.wrapped |= names
            self.wraps.append(line_of(self, inner))
        if isinstance(value, cst.Call) and is_loader(value) and training_loader(value, names):
            self.trains.add(id(value))
        if isinstance(value, cst.Call) and is_loader(value):
            self.bound[id(value)] = (value, line_of(self, value), names)
        if isinstance(value, cst.Call) and (".optim." in f".{dotted(value.func)}" or dotted(value.func) in
                                            self.optimizer_kinds) and "lr_scheduler" not in dotted(value.func):
            self.optimizers |= names
        if isinstance(value, cst.Call) and (".lr_scheduler." in f".{dotted(value.func)}" or dotted(value.func) in
                                            self.scheduler_kinds):
            self.schedulers |= names

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func)
        at = line_of(self, node)
        if isinstance(node.func, cst.Name):
            self.calls.append((name, _named_args(node)))
        if name.endswith("cuda.device_count"):
            self.findings.append((at, "torch.cuda.device_count(): under DDP each rank has one GPU and the job has "
                                      "runtime.world_size() of them; use that where the model's logic depends on it"))
        elif name in ("torch.load", "load") and name.startswith("torch"):
            self.findings.append((at, "torch.load: resuming from a checkpoint? runtime.Checkpointer saves and loads "
                                      "model, optimizer, data position and random state; clusterddp drill proves "
                                      "the resume exact before a long job"))
        elif name == "torch.save" and node.args and dotted(node.args[0].value) in self.wrapped:
            self.findings.append((at, "torch.save of the whole model pickles the DDP wrapper; save runtime.unwrap("
                                      "model) (or its state_dict()), which loads without a process group"))
        elif name == "isinstance" and "DataParallel" in code_of(node):
            self.findings.append((at, "isinstance(..., nn.DataParallel) is now False (the model is wrapped in DDP): "
                                      "use runtime.unwrap(model), which takes the wrapper off when there is one"))
        elif name == "len" and len(node.args) == 1 and isinstance(node.args[0].value, cst.Attribute) and \
                node.args[0].value.attr.value == "dataset" and isinstance(node.args[0].value.value, cst.Name):
            self.sizes.append((at, node.args[0].value.value.value))
        elif name == "len" and len(node.args) == 1 and isinstance(node.args[0].value, cst.Name):
            self.lengths.append((at, node.args[0].value.value))  # len(train_set): a split loader's set?
        elif name.endswith("requires_grad_") or (name == "setattr" and "requires_grad" in code_of(node)):
            self._frozen(at)
        elif name == "open" and len(node.args) > 1 and isinstance(node.args[1].value, cst.SimpleString) and \
                set(str(node.args[1].value.evaluated_value)) & set("wax"):
            self.findings.append((at, "every rank opens this file for writing: the ranks write one path at once "
                                      "(lines interleave, the last one wins); write it on rank 0 only (if "
                                      "runtime.is_main():) or name it per rank (runtime.rank())"))
        elif name in ("shutil.copyfile", "shutil.copy", "shutil.copy2", "shutil.move", "os.rename", "os.replace"):
            self.findings.append((at, f"every rank runs {name}: the ranks copy or move one path at once (a move "
                                      "leaves the next rank nothing to move; a copy of what rank 0 saves may catch "
                                      "it unfinished where the save does not wait); do it on rank 0 only (if "
                                      "runtime.is_main():)"))
        elif drawn_from(name, keyword(node, "generator") is not None, fixed_state(node)) or fresh_generator(node):
            source = drawn_from(name, keyword(node, "generator") is not None, fixed_state(node))
            said = unseeded(name, str(source), self.seeded) if source else fresh_generator(node)
            if said:
                self.findings.append((at, said))
        elif seeds(name):
            self.seeded |= seeds(name)
            self.findings.append((at, same_seed(seeds(name))))
        elif is_loader(node) and (keyword(node, "sampler") or keyword(node, "batch_sampler")):
            self.findings.append((at, "a DataLoader with its own sampler is not rewritten: give each rank its share "
                                      "(a DistributedSampler around it, set_epoch every epoch)"))
        elif is_loader(node) and not training_loader(node) and id(node) not in self.trains:
            self.findings.append((at, "a DataLoader without shuffle=True (evaluation?) is left as it is: every rank "
                                      "goes through the whole set; to share it, runtime.loader(..., shuffle=False) "
                                      "and average the metric with runtime.all_reduce_mean"))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if isinstance(node.target, cst.Attribute) and node.target.attr.value == "requires_grad":
            self._frozen(line_of(self, node))

    def _frozen(self, at: int) -> None:
        """requires_grad changed after the first wrap: DDP decided at the wrap which parameters it reduces."""
        if self.wraps and at > min(self.wraps):
            self.findings.append((at, "requires_grad changed after the DDP wrap: DDP fixed at the wrap which "
                                      "parameters it all-reduces; freeze before runtime.wrap, or pass "
                                      "find_unused_parameters=True to it (a backward that leaves parameters "
                                      "without a gradient fails: 'Expected to have finished reduction')"))

    def visit_For(self, node: cst.For) -> None:
        self._accumulation(node)
        self.depth += 1
        over = node.iter
        for _ in range(2):  # enumerate(tqdm(loader)): the bar is the loop's, the loader what it goes over
            if isinstance(over, cst.Name) and over.value in self.named_bars:  # bar = tqdm(loader); for x in bar
                over = self.named_bars[over.value]
            if isinstance(over, cst.Call) and dotted(over.func).split(".")[-1] == "tqdm":
                self.bars.add(id(over))
            if isinstance(over, cst.Call) and dotted(over.func).split(".")[-1] in ("enumerate", "tqdm", "iter") \
                    and over.args:
                over = over.args[0].value
        if isinstance(over, cst.Name):
            backward = ".backward(" in code_of(node.body)
            self.iterated[over.value] = self.iterated.get(over.value, False) or backward
            if self.within and over.value in self.params.get(self.within[-1], []):
                key = (self.within[-1], over.value)
                self.param_loops[key] = self.param_loops.get(key, False) or backward

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.within.append(node.name.value)
        self.params[node.name.value] = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.within.pop()

    def _passed(self) -> None:
        """A name given to a function of the script is looped over as that function loops over the parameter."""
        for function, args in self.calls:
            params = self.params.get(function, [])
            for index, word, name in args:
                param = word if word is not None else (params[index] if index is not None and index < len(params)
                                                       else None)
                if param is not None and (function, param) in self.param_loops:
                    self.iterated[name] = self.iterated.get(name, False) or self.param_loops[(function, param)]
                if param is not None:
                    self.dict_args.append((param, name))
                for key, backward in list(self.iterated.items()) if param is not None else ():
                    if key.startswith(f"{param}["):  # a dict of loaders given to it: its keys' loops
                        mine = name + key[len(str(param)):]
                        self.iterated[mine] = self.iterated.get(mine, False) or backward
                        self.key_aliases.append((key, mine))

    def leave_For(self, node: cst.For) -> None:
        self.depth -= 1

    def visit_While(self, node: cst.While) -> None:
        self._accumulation(node)
        self.depth += 1

    def leave_While(self, node: cst.While) -> None:
        self.depth -= 1

    def leave_Module(self, node: cst.Module) -> None:
        """What needs the whole script seen: the wraps, the evaluation loaders, the sizes of training sets."""
        if len(self.wraps) > 1:
            for at in self.wraps:
                self.findings.append((at, f"{len(self.wraps)} models wrapped (a GAN?): a step whose backward leaves "
                                          "one model's parameters without a gradient (frozen, or its output "
                                          "detached) fails under DDP ('Expected to have finished reduction'); "
                                          "pass find_unused_parameters=True to runtime.wrap where --check says so"))
        self.bound.update(self.uses.bound)
        self.trains |= {key for key, (call, _, names) in self.uses.bound.items() if training_loader(call, names)}
        for name, backward in self.uses.iterated.items():
            self.iterated[name] = self.iterated.get(name, False) or backward
        self._passed()
        for caller, builder in self.uses.aliases():  # tr, va = make_loaders(): the loops over tr are train_loader's
            if caller in self.iterated:
                self.iterated[builder] = self.iterated.get(builder, False) or self.iterated[caller]
        self._evaluation()
        self._unshuffled_training()
        phases_in_one_call(self)
        trains = {n for key, (call, _, names) in self.bound.items() if key in self.trains for n in names}
        sharded = {n for key, (_, _, names) in self.bound.items()
                   if key not in self.evaluation and (key in self.trains or training_loader(self.bound[key][0]))
                   for n in names}
        sharded |= {caller for caller, builder in self.uses.aliases() if builder in sharded}
        sharded |= {key for key, mine in self.key_aliases if mine in sharded}
        self.findings += divided_wrongly(self.uses, sharded)
        sets = {call.args[0].value.value for key, (call, _, names) in self.bound.items() if names & sharded and
                call.args and isinstance(call.args[0].value, cst.Name) and call.args[0].keyword is None}
        listed = {line for line, _ in self.findings}
        for at, name in self.lengths:
            if name in sets and at not in listed:
                self.findings.append((at, f"len({name}) counts the whole set, which a loader now splits over the "
                                          "ranks: each rank goes through about 1 / world size of it an epoch "
                                          "(len(loader) batches); a step count, a schedule's total or a mean made "
                                          "from it is world size x too large"))
        given = {param for param, name in self.dict_args if name in sharded}  # (a parameter given a split loader)
        for at, loader in self.sizes:
            if loader in trains or loader in given:
                self.findings.append((at, f"len({loader}.dataset) is the whole set: each rank now goes through "
                                          f"about len({loader}.dataset) / runtime.world_size() samples an epoch "
                                          f"(len({loader}) batches); counts or averages over it are per rank"))

    def _unshuffled_training(self) -> None:
        """A loader without shuffle=True that a loop with a backward goes over trains (a GAN's, often): where the
        backward runs decides, not shuffle. It becomes runtime.loader(..., shuffle=False): each rank its share, in
        the order it had."""
        for key, (call, at, names) in self.bound.items():
            if key in self.trains or keyword(call, "sampler") or keyword(call, "batch_sampler"):
                continue
            if any(self.iterated.get(n) for n in names):
                self.trains.add(key)
                self.unshuffled.add(key)
                self.findings = [(line, what) for line, what in self.findings
                                 if not (line == at and "without shuffle=True" in what)]

    def _evaluation(self) -> None:
        """A shuffled loader looped over only where no backward runs (whatever its name), while another loop over a
        loader does run one: it evaluates; splitting it would compute the metric on each rank's share and pick a
        "best" per rank."""
        if not any(self.iterated.values()):
            return  # no loop that trains was seen: nothing to go by
        for key, (call, at, names) in self.bound.items():
            looped = [self.iterated[n] for n in names if n in self.iterated]
            if looped and not any(looped) and training_loader(call, names):
                self.evaluation.add(key)
                self.trains.discard(key)
                self.findings.append((at, "a DataLoader with shuffle=True, looped over only where no backward runs "
                                          "(evaluation?), is left as it is: every rank goes through the whole set; "
                                          "to share it, runtime.loader(..., shuffle=False) and average the metric "
                                          "with runtime.all_reduce_mean"))

    def _accumulation(self, loop: Any) -> None:
        """A backward in the loop and an optimizer step under an ``if ... % ...``: gradient accumulation."""
        code = code_of(loop.body)
        if ".backward(" not in code or "no_sync" in code:
            return
        for statement in loop.body.body:
            # (an if with its own backward is a schedule of steps, a GAN's generator every n_critic batches)
            if isinstance(statement, cst.If) and "%" in code_of(statement.test) and \
                    ".step(" in code_of(statement.body) and ".backward(" not in code_of(statement.body):
                self.findings.append((line_of(self, statement), "gradient accumulation without model.no_sync(): every "
                                      "backward all-reduces; wrap the backward of the steps that do not step the "
                                      "optimizer in `with model.no_sync():`"))


#: nn.Module methods that return the module itself.
SELF_METHODS = {"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "requires_grad_"}


def module_of(value: Any) -> Any:
    """The call a chain of the module's own methods is made on (``X(...).to(d).train()`` -> ``X(...)``)."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
            value.func.attr.value in SELF_METHODS and isinstance(value.func.value, cst.Call):
        value = value.func.value
    return value


def _named_args(call: cst.Call) -> List[Tuple[Optional[int], Optional[str], str]]:
    """(position or None, keyword or None, name) of each argument that is a plain name; positions end at a *args."""
    out: List[Tuple[Optional[int], Optional[str], str]] = []
    position: Optional[int] = 0
    for arg in call.args:
        if arg.star:
            position = None
            continue
        at = position if arg.keyword is None else None
        if arg.keyword is None and position is not None:
            position += 1
        if isinstance(arg.value, cst.Name):
            out.append((at, arg.keyword.value if arg.keyword is not None else None, arg.value.value))
    return out
