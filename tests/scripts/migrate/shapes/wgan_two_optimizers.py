"""A Wasserstein GAN (weight clipping) on CIFAR-10, in the shape of a GAN repository's training script: options
parsed when the module is imported, a device chosen there too, cudnn.benchmark, two models wrapped in DataParallel
with more than one GPU, each model's forward also using the functional data_parallel when asked for several GPUs,
an RMSprop optimizer per model (the critic steps every batch and has its weights clipped, the generator every
n_critic batches), an unshuffled loader, image grids written now and then, and both state dicts saved every epoch.
--phase generate reloads the generator and writes one grid."""
import argparse
import os
import random

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.utils.data
import torchvision.datasets as dset
import torchvision.transforms as transforms
import torchvision.utils as vutils

parser = argparse.ArgumentParser(description="WGAN on CIFAR-10")
parser.add_argument("--dataroot", default="./datasets/cifar")
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--image_size", type=int, default=32)
parser.add_argument("--nz", type=int, default=32, help="size of the latent vector")
parser.add_argument("--epochs", type=int, default=25)
parser.add_argument("--lr", type=float, default=5e-5)
parser.add_argument("--clip_value", type=float, default=0.01)
parser.add_argument("--n_critic", type=int, default=5)
parser.add_argument("--ngpu", type=int, default=1)
parser.add_argument("--outf", default="./outputs")
parser.add_argument("--checkpoint_dir", default="./checkpoints")
parser.add_argument("--manualSeed", type=int, default=None)
parser.add_argument("--phase", choices=["train", "generate"], default="train")
opt = parser.parse_args()

try:
    os.makedirs(opt.outf)
    os.makedirs(os.path.join(opt.outf, "samples"))
    os.makedirs(opt.checkpoint_dir)
except OSError:
    pass

if opt.manualSeed is None:
    opt.manualSeed = random.randint(1, 10000)
random.seed(opt.manualSeed)
torch.manual_seed(opt.manualSeed)
cudnn.benchmark = True
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(opt.nz, 64, 4, 1, 0, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
            nn.ConvTranspose2d(64, 32, 4, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(True),
            nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(True),
            nn.ConvTranspose2d(16, 3, 4, 2, 1, bias=False), nn.Tanh(),
        )

    def forward(self, x):
        if x.is_cuda and self.ngpu > 1:
            return nn.parallel.data_parallel(self.main, x, range(self.ngpu))
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(3, 16, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(16, 32, 4, 2, 1, bias=False), nn.BatchNorm2d(32), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(32, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(64, 1, 4, 1, 0, bias=False),
        )

    def forward(self, x):
        if x.is_cuda and self.ngpu > 1:
            out = nn.parallel.data_parallel(self.main, x, range(self.ngpu))
        else:
            out = self.main(x)
        return out.view(-1)


def train():
    dataset = dset.CIFAR10(root=opt.dataroot, download=True, transform=transforms.Compose([
        transforms.Resize(opt.image_size),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ]))
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batch_size, num_workers=int(opt.workers))

    netG = Generator(opt.ngpu)
    netD = Discriminator(opt.ngpu)
    if torch.cuda.device_count() > 1:
        netG = torch.nn.DataParallel(netG)
        netD = torch.nn.DataParallel(netD)
    netG.to(device)
    netD.to(device)
    optimizerD = torch.optim.RMSprop(netD.parameters(), lr=opt.lr)
    optimizerG = torch.optim.RMSprop(netG.parameters(), lr=opt.lr)
    fixed_noise = torch.randn(opt.batch_size, opt.nz, 1, 1, device=device)

    for epoch in range(opt.epochs):
        for i, (real, _) in enumerate(dataloader):
            real = real.to(device)
            noise = torch.randn(real.size(0), opt.nz, 1, 1, device=device)

            optimizerD.zero_grad()
            fake = netG(noise).detach()
            errD = -torch.mean(netD(real)) + torch.mean(netD(fake))
            errD.backward()
            optimizerD.step()
            for p in netD.parameters():
                p.data.clamp_(-opt.clip_value, opt.clip_value)

            if i % opt.n_critic == 0:
                optimizerG.zero_grad()
                errG = -torch.mean(netD(netG(noise)))
                errG.backward()
                optimizerG.step()
                print(f"[{epoch}/{opt.epochs}][{i}/{len(dataloader)}] Loss_D: {errD.item():.6f} "
                      f"Loss_G: {errG.item():.4f}")

            if i % 100 == 0:
                vutils.save_image(real, os.path.join(opt.outf, "real_samples.png"), normalize=True)
                vutils.save_image(netG(fixed_noise).detach(), os.path.join(opt.outf, f"fake_epoch_{epoch}.png"),
                                  normalize=True)

        torch.save(netG.state_dict(), os.path.join(opt.checkpoint_dir, "cifar_G.pth"))
        torch.save(netD.state_dict(), os.path.join(opt.checkpoint_dir, "cifar_D.pth"))


def generate():
    netG = Generator(opt.ngpu).to(device)
    netG.load_state_dict(torch.load(os.path.join(opt.checkpoint_dir, "cifar_G.pth"), map_location=device))
    netG.eval()
    with torch.no_grad():
        images = netG(torch.randn(64, opt.nz, 1, 1, device=device))
    vutils.save_image(images, os.path.join(opt.outf, "samples", "generated.png"), normalize=True)


if __name__ == "__main__":
    if opt.phase == "train":
        train()
    else:
        generate()
