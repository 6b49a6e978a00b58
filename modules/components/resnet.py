"""A small CIFAR-style ResNet (He et al. 2016, section 4.2) with a selectable activation.

``conv3x3 -> [stage of BasicBlocks] x len(widths) -> global average pool -> Linear``; stage ``s > 0``
halves the resolution. Each activation is its own module (``act1``, ``act2``) so hooks see what every
convolution reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from errors import ConfigError
from modules.components.activations import get_activation
from modules.components.norms import ChannelNorm, make_norm


def _channel_norm(norm: ChannelNorm, channels: int, groups: int) -> nn.Module:
    """``make_norm`` restricted to the norms of image channels (``batch``, ``group``)."""
    return make_norm(norm, channels, groups=groups, choices=ChannelNorm)


class BasicBlock(nn.Module):
    """``act2(bn2(conv2(act1(bn1(conv1(x))))) + shortcut(x))``."""

    def __init__(self, c_in: int, c_out: int, stride: int, activation: str, norm: ChannelNorm = "batch",
                 norm_groups: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _channel_norm(norm, c_out, norm_groups)
        self.act1 = get_activation(activation)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = _channel_norm(norm, c_out, norm_groups)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), _channel_norm(norm, c_out, norm_groups)
            )
        self.act2 = get_activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act2(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: images ``(B, C, H, W)`` -> ``num_classes`` logits (a task network).

    Args:
        in_shape: one image's shape ``(C, H, W)`` (or its channel count): 1 channel for digits, 3 for CIFAR.
        num_classes: number of classes.
        widths: channels of each stage (the stem has ``widths[0]``).
        blocks_per_stage: BasicBlocks per stage (3 gives ResNet-20 with the default three stages).
        activation: activation name (see ``activation_names()``).
        norm: ``batch`` (BatchNorm2d) or ``group`` (GroupNorm, e.g. for federated learning, where running
            statistics averaged over clients are ill-defined).
        norm_groups: groups of every GroupNorm.
    """

    def __init__(
        self,
        in_shape: int | Sequence[int] = (1, 8, 8),
        num_classes: int = 10,
        widths: Sequence[int] = (16, 32, 64),
        blocks_per_stage: int = 1,
        activation: str = "relu",
        norm: ChannelNorm = "batch",
        norm_groups: int = 2,
    ) -> None:
        super().__init__()
        in_channels = in_shape if isinstance(in_shape, int) else int(in_shape[0])
        if not isinstance(in_shape, int) and len(in_shape) != 3:
            raise ConfigError(f"ResNet needs images (C, H, W), got samples of shape {tuple(in_shape)}: set image_shape: true")
        if not widths or min(widths) <= 0 or blocks_per_stage <= 0 or in_channels <= 0 or num_classes <= 0:
            raise ConfigError(
                f"ResNet sizes must be positive: widths={list(widths)}, blocks={blocks_per_stage}"
            )
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), _channel_norm(norm, widths[0], norm_groups)
        )
        self.stem_act = get_activation(activation)
        stages: list[nn.Module] = []
        c = widths[0]
        for s, w in enumerate(widths):
            blocks = [
                BasicBlock(c if b == 0 else w, w, 2 if (s > 0 and b == 0) else 1, activation, norm, norm_groups)
                for b in range(blocks_per_stage)
            ]
            stages.append(nn.Sequential(*blocks))
            c = w
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(c, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ConfigError(
                f"ResNet expects images (B, C, H, W), got {tuple(x.shape)}; use image_shape=True"
            )
        return self.fc(self.flatten(self.pool(self.stages(self.stem_act(self.stem(x))))))
