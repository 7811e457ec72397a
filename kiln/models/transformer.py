"""A Transformer-encoder text classifier: embeddings, nn.TransformerEncoder, mean pooling, linear head."""

import kiln
import kiln.nn as nn


class TransformerClassifier(nn.Module):
    def __init__(self, vocab_size=100, d_model=32, nhead=4, num_layers=2, dim_feedforward=64, max_len=64,
                 num_classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens):
        positions = kiln.arange(tokens.shape[1])
        x = self.embed(tokens) + self.pos(positions)
        x = self.encoder(x)
        return self.head(x.mean(dim=1))
