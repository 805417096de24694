"""An eval score counts only for a model that never trained on the eval set.

    train_version_id = check_lineage(session, target, eval_version)

The candidate's lineage is its training run's dataset version. Its train split may share no
prompt key (`flywheel.datasets.items`: the same question, whatever the answer) with the eval
split it is scored on; a model with no recorded training data cannot show that, so it is
refused too. Dataset builds keep every new version clean; this check catches a candidate
trained on an older version whose train held what a later eval set asks.
"""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from flywheel.datasets.membership import prompt_keys
from flywheel.datasets.models import DatasetVersion
from flywheel.errors import InvalidState
from flywheel.registry.models import ModelVersion, Run


def check_lineage(
    session: Session, target: ModelVersion, evaluation: DatasetVersion, domain: str
) -> uuid.UUID:
    """The id of the dataset version `target` trained on, once it is known to share no prompt
    with `evaluation`'s eval split; InvalidState (one line, naming the fix) otherwise."""
    run = session.get(Run, target.training_run_id) if target.training_run_id else None
    if run is None or run.dataset_version_id is None:
        raise InvalidState(
            f"v{target.version} of {domain} has no recorded training dataset version, so its "
            "eval score could have been trained on: train it with flywheel train"
        )
    trained = session.get_one(DatasetVersion, run.dataset_version_id)
    shared = prompt_keys(session, [trained.id], "train") & prompt_keys(
        session, [evaluation.id], "eval"
    )
    if shared:
        raise InvalidState(
            f"v{target.version} of {domain} trained on dataset v{trained.version}, which shares "
            f"{len(shared)} prompts with the eval set of dataset v{evaluation.version}: it cannot "
            f"be scored on it (train on v{evaluation.version}: flywheel train ... --domain "
            f"{domain} --dataset-version {evaluation.version})"
        )
    return trained.id
