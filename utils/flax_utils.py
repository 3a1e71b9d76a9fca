"""Flax helpers shared by every agent: a dictionary of modules, a train state and params checkpoints."""

import functools
import glob
import os
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from utils.io_utils import atomic_write_bytes

nonpytree_field = functools.partial(flax.struct.field, pytree_node=False)

# The static parts of a train state (module definition, optimizer) are part of every compiled call's cache key, and
# JAX compares them by identity (a bound `apply` method, optax's closures). Agents built alike in one process (a
# notebook, the test suite, evaluation copies) share one definition and one optimizer object, so their calls reuse the
# programs already traced and compiled instead of tracing, lowering and loading them again.
_DEFINITIONS = []  # Every module definition a train state was created with in this process (distinct by value).


def shared_definition(model_def):
    """The first module definition created in this process that equals `model_def` (Flax modules compare by their
    fields), else `model_def` itself, kept for the next one."""
    for seen in _DEFINITIONS:
        if _same_definition(seen, model_def):
            return seen
    _DEFINITIONS.append(model_def)
    return model_def


def _same_definition(a, b):
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError):  # a field that does not compare to one bool (an array): never shared
        return False


@functools.cache
def adam(learning_rate, weight_decay=0.0, clip_norm=None):
    """Adam (AdamW where `weight_decay` > 0), after clipping the gradients to global norm `clip_norm` when given;
    one optax object per hyperparameters (see `shared_definition`)."""
    if weight_decay > 0:
        tx = optax.adamw(learning_rate=learning_rate, weight_decay=weight_decay)
    else:
        tx = optax.adam(learning_rate=learning_rate)
    return tx if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), tx)


class ModuleDict(nn.Module):
    """Holds several named modules under one set of params.

    Called without `name` (only at init) it runs every module on its own example inputs given as keyword arguments;
    called with `name` it runs that one module, or its method `method_name` when given.
    """

    modules: dict[str, nn.Module]

    @nn.compact
    def __call__(self, *args, name=None, method_name=None, **kwargs):
        if name is not None:
            module = self.modules[name]
            return (module if method_name is None else getattr(module, method_name))(*args, **kwargs)
        if set(kwargs) != set(self.modules):
            raise ValueError(
                f'Init needs inputs for exactly these modules: {sorted(self.modules)}, got {sorted(kwargs)}'
            )
        out = {}
        for key, value in kwargs.items():
            if isinstance(value, Mapping):
                out[key] = self.modules[key](**value)
            elif isinstance(value, Sequence):
                out[key] = self.modules[key](*value)
            else:
                out[key] = self.modules[key](value)
        return out


class TrainState(flax.struct.PyTreeNode):
    """Params, optimizer state and the module definition.

    Calling the state runs the module with the stored params unless `params=` is given, so a loss differentiates
    only the calls that receive `params=grad_params`.
    """

    step: int
    apply_fn: Any = nonpytree_field()
    model_def: Any = nonpytree_field()
    params: Any
    tx: Any = nonpytree_field()
    opt_state: Any

    @classmethod
    def create(cls, model_def, params, tx=None, **kwargs):
        """Builds a state for `model_def` with `params` and optimizer `tx` (None for a frozen module)."""
        model_def = shared_definition(model_def)
        opt_state = tx.init(params) if tx is not None else None
        return cls(
            step=1, apply_fn=model_def.apply, model_def=model_def, params=params, tx=tx, opt_state=opt_state, **kwargs
        )

    def __call__(self, *args, params=None, **kwargs):
        """Runs the module, with the stored params unless `params` is given."""
        if params is None:
            params = self.params
        return self.apply_fn({'params': params}, *args, **kwargs)

    def select(self, name, method_name=None):
        """Returns a callable running the sub-module `name` of a ModuleDict (or its method `method_name`)."""
        if method_name is None:
            return functools.partial(self, name=name)
        return functools.partial(self, name=name, method_name=method_name)

    def apply_gradients(self, grads, **kwargs):
        """One optimizer step."""
        updates, new_opt_state = self.tx.update(grads, self.opt_state, self.params)
        new_params = optax.apply_updates(self.params, updates)
        return self.replace(step=self.step + 1, params=new_params, opt_state=new_opt_state, **kwargs)

    def apply_loss_fn(self, loss_fn):
        """Differentiates `loss_fn(params) -> (loss, info)`, steps the optimizer, adds gradient statistics to info."""
        grads, info = jax.grad(loss_fn, has_aux=True)(self.params)
        leaves = jax.tree_util.tree_leaves(grads)
        info = dict(info)
        info['grad/max'] = jnp.max(jnp.stack([jnp.max(g) for g in leaves]))
        info['grad/min'] = jnp.min(jnp.stack([jnp.min(g) for g in leaves]))
        # The reference's `grad/norm`: the sum of the per-leaf L2 norms (not the global L2 norm).
        info['grad/norm'] = sum(jnp.sqrt(jnp.sum(jnp.square(g))) for g in leaves)
        return self.apply_gradients(grads=grads), info


def target_update(network, module_name, tau, source_params):
    """New params of `network` with `modules_target_<name>` set to a `tau` step from the target toward the critic,
    both read from `source_params`.

    The agents pass the params from before the gradient step, as the reference does: the target trails the online
    critic by one step, and an optimizer step that touches the target itself (AdamW's weight decay reaches every
    param) is discarded.
    """
    new_target = jax.tree_util.tree_map(
        lambda p, tp: p * tau + tp * (1 - tau),
        source_params[f'modules_{module_name}'],
        source_params[f'modules_target_{module_name}'],
    )
    params = dict(network.params)
    params[f'modules_target_{module_name}'] = new_target
    return params


def init_network(network_info, init_rng, tx, targets=()):
    """The `TrainState` of the modules of `network_info` = {name: (module, example inputs)}, initialised with
    `init_rng` and optimised by `tx`; each `target_<name>` of `targets` starts as a copy of `<name>`."""
    network_def = ModuleDict({name: module for name, (module, _) in network_info.items()})
    params = network_def.init(init_rng, **{name: inputs for name, (_, inputs) in network_info.items()})['params']
    for name in targets:
        params[f'modules_target_{name}'] = params[f'modules_{name}']
    return TrainState.create(network_def, params, tx=tx)


def sum_losses(**parts):
    """The sum of named losses and their infos prefixed by name: `sum_losses(critic=(loss, info), ...)` gives
    (total, {'critic/<key>': ...})."""
    total, info = 0.0, {}
    for prefix, (loss, loss_info) in parts.items():
        total = total + loss
        info.update({f'{prefix}/{k}': v for k, v in loss_info.items()})
    return total, info


def gradient_step(agent, batch, targets=('critic',), target_period=1):
    """One optimizer step of `agent.total_loss` on `batch` with the next key of `agent.rng`, then a soft update (rate
    `config['tau']`) of each `target_<name>` of `targets` toward the pre-step `<name>`; with `target_period` > 1
    only on every `target_period`-th update (the network's step count: the 2nd, 4th, ... for 2). Returns
    (agent, info)."""
    new_rng, rng = jax.random.split(agent.rng)
    network, info = agent.network.apply_loss_fn(lambda grad_params: agent.total_loss(batch, grad_params, rng=rng))
    moves = agent.network.step % target_period == 0  # `step` counts updates from 1
    for name in targets:
        params = target_update(network, name, agent.config['tau'], source_params=agent.network.params)
        if target_period > 1:  # keep the old target on the other updates (only that module's leaves are selected)
            key = f'modules_target_{name}'
            params[key] = jax.tree_util.tree_map(lambda new, old: jnp.where(moves, new, old), params[key],
                                                 network.params[key])  # fmt: skip
        network = network.replace(params=params)
    return agent.replace(network=network, rng=new_rng), info


def scan_updates(update_fn, agent, batches):
    """Applies `update_fn(agent, batch) -> (agent, info)` over the leading axis of `batches` in one `lax.scan`.

    Returns the last update's info, so a fused block logs what the last of its updates would log on its own, offline
    and online alike (the reference averages over the U updates of an online step; see docs/DEVIATIONS.md).
    """
    agent, infos = jax.lax.scan(update_fn, agent, batches)
    return agent, jax.tree_util.tree_map(lambda x: x[-1], infos)


def save_agent(agent, save_dir, step):
    """Saves the agent's state (params, optimizer state, rng) to `<save_dir>/params_<step>.pkl`, atomically."""
    state = jax.device_get(flax.serialization.to_state_dict(agent))
    path = os.path.join(save_dir, f'params_{step}.pkl')
    atomic_write_bytes(path, pickle.dumps(dict(agent=state)))
    return path


def restore_agent_with_file(agent, file_path):
    """Loads a `params_<step>.pkl` file into an agent created with the same config."""
    with open(file_path, 'rb') as f:
        load_dict = pickle.load(f)
    return flax.serialization.from_state_dict(agent, load_dict['agent'])


def restore_agent(agent, restore_path, restore_step):
    """Loads `params_<restore_step>.pkl` from the one directory matching the glob `restore_path`."""
    candidates = glob.glob(restore_path)
    if len(candidates) != 1:
        raise FileNotFoundError(f'Expected exactly one directory matching {restore_path!r}, found {len(candidates)}')
    return restore_agent_with_file(agent, os.path.join(candidates[0], f'params_{restore_step}.pkl'))
