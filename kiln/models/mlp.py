"""A multi-layer perceptron. Written in plain torch style: the tests run this same source under torch."""

import kiln
import kiln.nn as nn
import kiln.nn.functional as F


class MLP(nn.Module):
    def __init__(self, in_features=32, hidden=(64, 64), out_features=10):
        super().__init__()
        sizes = [in_features, *hidden]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.head = nn.Linear(sizes[-1], out_features)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return kiln.log_softmax(self.head(x), dim=-1)
