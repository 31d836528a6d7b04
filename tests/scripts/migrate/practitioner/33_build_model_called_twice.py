import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_model(width):
    net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 10))
    if torch.cuda.device_count() > 1:
        net = nn.DataParallel(net)
    return net.to(device)


teacher = build_model(1024)
teacher.load_state_dict(torch.load("teacher.pt"))
teacher.eval()
for p in teacher.parameters():
    p.requires_grad = False

student = build_model(64)
opt = torch.optim.Adam(student.parameters(), lr=1e-3)
loader = DataLoader(TensorDataset(torch.randn(30000, 32), torch.randint(0, 10, (30000,))),
                    batch_size=256, shuffle=True)
T, alpha = 4.0, 0.7

for epoch in range(20):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with torch.no_grad():
            t_logits = teacher(x)
        s_logits = student(x)
        kd = nn.functional.kl_div(nn.functional.log_softmax(s_logits / T, 1),
                                  nn.functional.softmax(t_logits / T, 1), reduction="batchmean") * T * T
        loss = alpha * kd + (1 - alpha) * nn.functional.cross_entropy(s_logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} distill loss {loss.item():.4f}")

torch.save(student.state_dict(), "student.pt")
