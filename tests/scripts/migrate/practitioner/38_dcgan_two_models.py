import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

nz, ngf, ndf = 64, 32, 32
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
ngpu = torch.cuda.device_count()

netG = nn.Sequential(nn.ConvTranspose2d(nz, ngf * 2, 7, 1, 0), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
                     nn.ConvTranspose2d(ngf * 2, 1, 4, 2, 1), nn.Tanh()).to(device)
netD = nn.Sequential(nn.Conv2d(1, ndf, 4, 2, 1), nn.LeakyReLU(0.2, True), nn.Flatten(),
                     nn.Linear(ndf * 7 * 7, 1)).to(device)
if (device.type == "cuda") and (ngpu > 1):
    netG = nn.DataParallel(netG, list(range(ngpu)))
    netD = nn.DataParallel(netD, list(range(ngpu)))

loader = DataLoader(TensorDataset(torch.rand(6400, 1, 14, 14) * 2 - 1), batch_size=64, shuffle=True)
criterion = nn.BCEWithLogitsLoss()
optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
fixed_noise = torch.randn(16, nz, 1, 1, device=device)

for epoch in range(25):
    for i, (real,) in enumerate(loader):
        real = real.to(device)
        b = real.size(0)
        noise = torch.randn(b, nz, 1, 1, device=device)
        fake = netG(noise)
        # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        errD_real = criterion(netD(real), torch.ones(b, 1, device=device))
        errD_real.backward()
        errD_fake = criterion(netD(fake.detach()), torch.zeros(b, 1, device=device))
        errD_fake.backward()
        optD.step()
        # (2) update G: maximize log(D(G(z)))
        netG.zero_grad()
        errG = criterion(netD(fake), torch.ones(b, 1, device=device))
        errG.backward()
        optG.step()
        if i % 50 == 0:
            print(f"[{epoch}/25][{i}/{len(loader)}] Loss_D: {(errD_real + errD_fake).item():.4f} Loss_G: {errG.item():.4f}")
    with torch.no_grad():
        samples = netG(fixed_noise).cpu()
    torch.save(samples, f"samples_epoch{epoch:03d}.pt")
    torch.save({"G": netG.state_dict(), "D": netD.state_dict()}, f"dcgan_{epoch:03d}.pt")
