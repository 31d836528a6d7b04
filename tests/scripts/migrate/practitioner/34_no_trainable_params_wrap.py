import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class LogMelFrontEnd(nn.Module):
    """Fixed feature extraction on the GPU: a mel filterbank and log compression, nothing to learn."""

    def __init__(self, n_fft=256, n_mels=40):
        super().__init__()
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("mel", torch.rand(n_fft // 2 + 1, n_mels))
        self.n_fft = n_fft

    def forward(self, wav):
        spec = torch.stft(wav, self.n_fft, window=self.window, return_complex=True).abs() ** 2
        return torch.log1p(spec.transpose(1, 2) @ self.mel)


class KeywordNet(nn.Module):
    def __init__(self, n_mels=40, n_words=12):
        super().__init__()
        self.gru = nn.GRU(n_mels, 128, batch_first=True)
        self.out = nn.Linear(128, n_words)

    def forward(self, feats):
        h, _ = self.gru(feats)
        return self.out(h[:, -1])


frontend = nn.DataParallel(LogMelFrontEnd()).cuda()
model = nn.DataParallel(KeywordNet()).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
wavs = TensorDataset(torch.randn(6000, 16000), torch.randint(0, 12, (6000,)))
loader = DataLoader(wavs, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)

for epoch in range(12):
    for wav, label in loader:
        with torch.no_grad():
            feats = frontend(wav.cuda(non_blocking=True))
        logits = model(feats)
        loss = nn.functional.cross_entropy(logits, label.cuda(non_blocking=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
torch.save(model.module.state_dict(), "kws.pt")
