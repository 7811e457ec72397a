"""An LSTM sequence tagger: embeddings, a bidirectional 2-layer LSTM, a per-token linear classifier."""

import kiln
import kiln.nn as nn


class LSTMTagger(nn.Module):
    def __init__(self, vocab_size=50, embedding_dim=16, hidden_size=24, num_tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers=2, batch_first=True, bidirectional=True)
        self.tag = nn.Linear(2 * hidden_size, num_tags)

    def forward(self, tokens):
        states, _ = self.lstm(self.embed(tokens))
        return kiln.log_softmax(self.tag(states), dim=-1)
