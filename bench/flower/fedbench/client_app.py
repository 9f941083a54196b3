"""Flower ClientApp: on each train message, ``local-epochs`` whole epochs of the node's shard (``task``)."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedbench import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Load the global model, train one round on this node's shard, send the weights back."""
    run, node = context.run_config, context.node_config
    example = str(run["example"])
    model = task.make_net(example)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    train_ds, _ = task.load_shard(str(node["data-dir"]), example)
    steps = task.train_round(
        model,
        train_ds,
        partition=int(node["partition-id"]),
        rnd=int(msg.content["config"]["server-round"]),
        steps=task.round_steps(
            train_ds, local_epochs=int(run["local-epochs"]), batch_size=int(run["batch-size"])
        ),
        batch_size=int(run["batch-size"]),
    )
    for _ in steps:
        pass
    reply = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(train_ds)})}
    )
    return Message(content=reply, reply_to=msg)
