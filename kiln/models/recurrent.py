"""A recurrent stack exercising every option of kiln.nn's recurrent layers, exported with a dynamic sequence dim:
a projected, 2-layer bidirectional LSTM with dropout between its layers, a bidirectional GRU without biases and a
ReLU RNN, all batch-first, then a linear head. Each layer's time loop exports as a scan."""

import kiln.nn as nn


class RecurrentStack(nn.Module):
    def __init__(self, features=12, hidden=16, classes=3):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True, bidirectional=True, proj_size=8,
                            dropout=0.1)
        self.gru = nn.GRU(16, 12, bias=False, batch_first=True, bidirectional=True)
        self.rnn = nn.RNN(24, 10, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(10, classes)

    def forward(self, x):
        states, _ = self.lstm(x)
        states, last = self.gru(states)
        states, _ = self.rnn(states)
        # the GRU's final states (a scan's final carries) feed the output too
        return self.head(states) + last.sum(0).mean(-1, keepdim=True).unsqueeze(1)
