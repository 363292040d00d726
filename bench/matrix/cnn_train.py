"""A convolutional network trained unmodified (cuDNN convolutions and their workspaces, batch
norm): 224x224 images in batches of 64, SGD with momentum, 8 steps; cuDNN's deterministic
algorithms, as a program that wants reproducible results asks. The digest is the losses."""
import torch
from torch import nn

from common import report, train

torch.backends.cudnn.deterministic = True
torch.manual_seed(0)


def block(cin, cout, stride):
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


model = nn.Sequential(*block(3, 64, 2), *block(64, 128, 1), *block(128, 128, 1), *block(128, 256, 2),
                      *block(256, 256, 1), *block(256, 512, 2), *block(512, 512, 1),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = torch.Generator(device="cuda").manual_seed(1)


def loss_of(_step):
    images = torch.randn(64, 3, 224, 224, device="cuda", generator=data)
    labels = torch.randint(0, 1000, (64,), device="cuda", generator=data)
    return nn.functional.cross_entropy(model(images), labels)


losses, step_s = train(8, loss_of, optimizer)
report("cnn_train", repr(losses).encode(), torch.cuda.max_memory_reserved(), step_s=step_s, losses=losses)
