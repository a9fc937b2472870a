"""torchvision v2's photometric `*_image` kernels on uint8 (N, 3, H, W) batches, one parameter per
sample: brightness, contrast, saturation, hue, sharpness, grayscale, posterize, solarize, invert,
autocontrast, equalize and Gaussian blur (what ColorJitter, the random-apply colour transforms,
GaussianBlur and the policies' photometric operations run).

Each functional kernel (`adjust_brightness` ... `gaussian_blur`) takes a batch and one parameter
per sample and returns a new uint8 batch in the input's memory format (the input is not modified):
it equals torchvision's `*_image` kernel applied to every sample with its own parameter. Each is
written for one chunk of samples (`_*_into`, into scratch memory) and registered in
`batching.CHUNKED_FORMS`, so that `batching.apply_kernel` runs it in place on a group of samples;
what keeps these chunk forms fast on a CPU: NOTE [CPU speed] in `fastload._augment.batching`. The
transforms' operations that draw the parameters and run the kernels are in `color_ops`.

NOTE [exactness]: the kernels repeat torchvision's float32 arithmetic operation for operation, so
that rounding and truncation land where torchvision's do: a uint8 value times a factor is the
float32 product; torchvision's `a.add_(b, alpha=w)` is the fused `a + b * w` (one rounding) on the
CPU, which `addcmul_` reproduces with a per-sample `w`; a float result goes back to uint8 by
truncation, rounding first only where torchvision rounds (blur). Equalize's integer algorithm is
PIL's, as torchvision's. Sharpness's smoothed image is (9-neighbourhood sum + 4 * centre) / 13
rounded: an integer that is never within float error of a half, so it is computed from integer
sums. The one approximation is `gaussian_blur`'s separable convolution (see there); the tests
check every kernel against torchvision sample by sample.
"""

from __future__ import annotations

import math

import torch

from fastload._augment.batching import (
    CHUNKED_FORMS,
    channel_extremes,
    channels_innermost,
    memory_permutation,
    reflect_pad,
    row,
    scratch,
    scratch_like,
    store,
    whole_batch,
)

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)
"""torchvision's luma weights for (r, g, b)."""

_MAX = 255
_TINY = 1e-30
"""A positive divisor that changes no quotient of the HSV conversion (its values are multiples of
1/255) but keeps 0 / 0 at 0, as torchvision's `where(eqc, ones, ...)` does."""


def _one_minus(factor: torch.Tensor) -> torch.Tensor:
    """(1 - factor) per sample as torchvision gets it: computed in double (a Python float), then
    used as a float32 scalar."""
    return (1.0 - factor.to(torch.float64)).to(torch.float32)


# Functional kernels: torchvision v2's `*_image` kernels, one parameter per sample


def _luma_into(image: torch.Tensor, luma: torch.Tensor) -> torch.Tensor:
    """torchvision's float grayscale of the batch `image` (uint8 or float32) into the float32
    plane `luma` (N, H, W): r * 0.2989, then g and b added with their weights (fused multiply-adds),
    not rounded. Returns luma."""
    red, green, blue = image.unbind(1)
    torch.mul(red, GRAY_WEIGHTS[0], out=luma)
    return luma.add_(green, alpha=GRAY_WEIGHTS[1]).add_(blue, alpha=GRAY_WEIGHTS[2])


def _float_copy(x: torch.Tensor) -> torch.Tensor:
    """The chunk x as float32, in a scratch tensor of x's layout."""
    image = scratch_like("image", x, torch.float32)
    return image.copy_(x)


def _blend_into(
    image: torch.Tensor, ratio: torch.Tensor, other: torch.Tensor | None, out: torch.Tensor
) -> None:
    """torchvision's `_blend(image, other, ratio)` per sample into the uint8 `out`: image * ratio +
    other * (1 - ratio), clamped and truncated. `image` is the float32 copy of a uint8 chunk (it is
    overwritten); `other` None blends with 0 (brightness), else float32 broadcasting to image."""
    image.mul_(row(ratio, image))
    if other is not None:
        image.addcmul_(other, row(_one_minus(ratio), image))  # torchvision: add_(other, alpha=1 - ratio)
    store(image.clamp_(0, _MAX), out)


def _brightness_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_brightness` on one chunk."""
    _blend_into(_float_copy(x), factor, None, out)


def _contrast_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_contrast` on one chunk."""
    image = _float_copy(x)
    luma = _luma_into(image, scratch_like("work1", x, torch.float32, channels=1)[:, 0])
    mean = torch.mean(luma.floor_(), dim=(-2, -1))
    _blend_into(image, factor, row(mean, image), out)


def _saturation_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_saturation` on one chunk: the gray plane is copied into each channel first, so that
    the blend runs on matching layouts (NOTE [CPU speed] (2))."""
    image = _float_copy(x)
    luma = _luma_into(image, scratch_like("work1", x, torch.float32, channels=1)[:, 0]).floor_()
    gray_image = scratch_like("work2", x, torch.float32)
    for channel in range(3):
        gray_image[:, channel].copy_(luma)
    _blend_into(image, factor, gray_image, out)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_brightness_image` per sample: x * factor, clamped, truncated.
    `factor` (N,) >= 0."""
    return whole_batch(adjust_brightness, x, factor)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_contrast_image` per sample: a blend of x with the mean of its floored
    grayscale. `factor` (N,) >= 0."""
    return whole_batch(adjust_contrast, x, factor)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_saturation_image` per sample: a blend of x with its floored grayscale.
    `factor` (N,) >= 0."""
    return whole_batch(adjust_saturation, x, factor)


def _grayscale_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`rgb_to_grayscale` on one chunk."""
    luma = _luma_into(x, scratch_like("work1", x, torch.float32, channels=1)[:, 0])
    gray = scratch_like("work2", x, torch.uint8, channels=1)[:, 0].copy_(luma)
    for channel in range(3):
        out[:, channel].copy_(gray)


def rgb_to_grayscale(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `rgb_to_grayscale_image(x, num_output_channels=3)`: the truncated luma, in
    all three channels."""
    return whole_batch(rgb_to_grayscale, x)


def _pulse(values: torch.Tensor, center: float, out: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """1.0 where `values` equal `center`, else 0.0 (exactly), into `out`: max(0, 1 - |values -
    center| * scale), for values whose distance to the center is 0 or at least 1 / scale."""
    torch.sub(values, center, out=out)
    return out.abs_().mul_(-scale).add_(1.0).clamp_(min=0.0)


def _hue_into(x: torch.Tensor, shift: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_hue` on one chunk: torchvision's `_rgb_to_hsv`, hue shift and `_hsv_to_rgb`, value
    for value, on planes (NOTE [CPU speed] (3)). Its selections (`where`, bool masks, `gather`)
    become sums of products with exact 0/1 masks, and its `fmod`/`remainder` by 1 become
    x - floor(x): the same values (NOTE [CPU speed] (4))."""
    n, _, height, width = x.shape
    planes = scratch("work1", (n, _HUE_PLANES, height, width), torch.float32, x.device, nhwc=False)
    image = planes[:, 0:3]
    for channel in range(3):
        image[:, channel].copy_(x[:, channel])
    image.mul_(1.0 / _MAX)
    red, green, blue = image.unbind(1)
    value, low, chroma, saturation, divisor, hue, temporary = planes[:, 3:10].unbind(1)
    distances = planes[:, 10:13]  # torchvision's rc, gc, bc: (max - r, max - g, max - b) / chroma
    is_red, is_green, is_blue = planes[:, 13:16].unbind(1)  # where the max is: r first, then g

    # _rgb_to_hsv
    torch.maximum(torch.maximum(red, green, out=value), blue, out=value)
    torch.minimum(torch.minimum(red, green, out=low), blue, out=low)
    torch.sub(value, low, out=chroma)
    # torchvision divides by where(max == min, 1, ...), and the numerator is then 0 too
    torch.div(chroma, torch.clamp(value, min=_TINY, out=saturation), out=saturation)
    torch.clamp(chroma, min=_TINY, out=divisor)
    torch.sub(value.unsqueeze(1), image, out=distances).div_(divisor.unsqueeze(1))
    rc, gc, bc = distances.unbind(1)
    _pulse(rc, 0.0, is_red, scale=1024.0)  # rc, gc: 0, or at least 1/255 (chroma <= 1)
    _pulse(gc, 0.0, is_green, scale=1024.0)
    torch.sub(1.0, is_red, out=is_blue)
    is_green.mul_(is_blue)
    is_blue.sub_(is_green)
    # hr = bc - gc, hg = rc + 2 - bc, hb = gc + 4 - rc, each masked, summed in torchvision's order
    torch.sub(bc, gc, out=hue).mul_(is_red)
    hue.add_(torch.add(rc, 2.0, out=temporary).sub_(bc).mul_(is_green))
    hue.add_(torch.add(gc, 4.0, out=temporary).sub_(rc).mul_(is_blue))
    hue.mul_(1.0 / 6.0).add_(1.0)
    hue.sub_(torch.floor(hue, out=temporary))  # fmod(hue, 1), hue in [0, 2)

    # the shift
    hue.add_(shift.to(torch.float32).view(-1, 1, 1))
    hue.sub_(torch.floor(hue, out=temporary))  # remainder(hue, 1)

    # _hsv_to_rgb
    h6 = hue.mul_(6)
    sextant = torch.floor(h6, out=temporary)
    fraction = h6.sub_(sextant)
    sextant.sub_(torch.div(sextant, 6, out=low).floor_().mul_(6))  # modulo 6
    sxf, one_minus_s, q = low, chroma, divisor
    t, p = distances.unbind(1)[:2]
    torch.mul(saturation, fraction, out=sxf)
    torch.sub(1.0, saturation, out=one_minus_s)
    torch.sub(1.0, sxf, out=q).mul_(value).clamp_(0.0, 1.0)
    torch.add(sxf, one_minus_s, out=t).mul_(value).clamp_(0.0, 1.0)
    torch.mul(one_minus_s, value, out=p).clamp_(0.0, 1.0)
    in_sextant = planes[:, 12:18]  # 1 where the sextant is 0, 1, ..., 5
    for index in range(6):
        _pulse(sextant, float(index), in_sextant[:, index])
    # in sextant i, r is (v, q, p, p, t, v)[i], g (t, v, v, q, p, p)[i], b (p, p, t, v, v, q)[i]
    picks = ((value, q, p, p, t, value), (t, value, value, q, p, p), (p, p, t, value, value, q))
    rgb = planes[:, 0:3]  # the input is read no more
    for channel, channel_picks in enumerate(picks):
        plane = torch.mul(channel_picks[0], in_sextant[:, 0], out=rgb[:, channel])
        for index in range(1, 6):
            plane.addcmul_(channel_picks[index], in_sextant[:, index])
    store(rgb.mul_(_MAX + 1.0 - 1e-3), out)  # torchvision's float-to-uint8 conversion


_HUE_PLANES = 18
"""The float32 planes per sample `_hue_into` works in."""


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_hue_image` per sample: the hue (in HSV, in turns) shifted by `shift`
    (N,) in [-0.5, 0.5]; converted back as torchvision does (x 255.999, truncated)."""
    return whole_batch(adjust_hue, x, shift)


def _sharpness_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_sharpness` on one chunk: the smoothed interior from integer sums (NOTE [exactness])."""
    n, _, height, width = x.shape
    if height <= 2 or width <= 2:  # torchvision leaves them be
        out.copy_(x)
        return
    nhwc = channels_innermost(x)
    pixels = scratch_like("work1", x, torch.int16).copy_(x)
    across = scratch("work2", (n, 3, height, width - 2), torch.int16, x.device, nhwc)
    torch.add(pixels[..., :-2], pixels[..., 1:-1], out=across).add_(pixels[..., 2:])
    box = scratch("work3", (n, 3, height - 2, width - 2), torch.int16, x.device, nhwc)
    torch.add(across[..., :-2, :], across[..., 1:-1, :], out=box).add_(across[..., 2:, :])
    box.add_(pixels[..., 1:-1, 1:-1], alpha=4)  # 1 1 1 / 1 5 1 / 1 1 1
    smoothed = scratch("work4", (n, 3, height - 2, width - 2), torch.float32, x.device, nhwc)
    smoothed.copy_(box).div_(13).round_()
    image = _float_copy(x)
    interior = image[..., 1:-1, 1:-1]
    interior.addcmul_(smoothed.sub_(interior), row(_one_minus(factor), interior))  # add_(alpha=1 - f)
    store(image.clamp_(0, _MAX), out)


def adjust_sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_sharpness_image` per sample: a blend of x with its 3x3-smoothed image
    (kernel 1 1 1 / 1 5 1 / 1 1 1, over 13, rounded) inside a one-pixel border that stays as it is.
    `factor` (N,) >= 0; images of height or width <= 2 come back unchanged."""
    return whole_batch(adjust_sharpness, x, factor)


def _posterize_into(x: torch.Tensor, bits: torch.Tensor, out: torch.Tensor) -> None:
    """`posterize` on one chunk."""
    bits = bits.to(torch.int64).view(-1, 1, 1, 1)
    mask = (bits.new_ones(()).bitwise_left_shift(bits) - 1).bitwise_left_shift_(8 - bits)
    torch.bitwise_and(x, mask.to(torch.uint8), out=out)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """torchvision's `posterize_image` per sample: keep the `bits` (N,) int64 in 0..8 most
    significant bits of every channel value."""
    return whole_batch(posterize, x, bits)


def _solarize_into(x: torch.Tensor, threshold: torch.Tensor, out: torch.Tensor) -> None:
    """`solarize` on one chunk."""
    lowest_inverted = torch.ceil(threshold.to(torch.float32)).clamp_(0, _MAX)
    inverted = x >= row(lowest_inverted, x, torch.uint8)
    torch.bitwise_xor(x, inverted.view(torch.uint8).neg_(), out=out)  # XOR 255 where inverted


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """torchvision's `solarize_image` per sample: invert every value >= `threshold` (N,), a float
    in [0, 255] compared as float32 (as torchvision compares a uint8 image with a Python float)."""
    return whole_batch(solarize, x, threshold)


def _invert_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`invert` on one chunk."""
    torch.bitwise_not(x, out=out)


def invert(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `invert_image`: 255 - x."""
    return whole_batch(invert, x)


def _autocontrast_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`autocontrast` on one chunk."""
    low, high = (extreme.to(torch.float32) for extreme in channel_extremes(x))
    constant = high == low
    inv_scale = high.sub_(low).mul_(1.0 / _MAX)
    low = torch.where(constant, 0.0, low)
    inv_scale = torch.where(constant, 1.0, inv_scale)
    image = _float_copy(x).sub_(row(low, x)).div_(row(inv_scale, x))
    store(image.clamp_(0, _MAX), out)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `autocontrast_image`: each channel of each sample stretched linearly from its
    (min, max) to (0, 255); a constant channel is left as it is."""
    return whole_batch(autocontrast, x)


def _count_values(values: torch.Tensor, bins: int) -> torch.Tensor:
    """How often each of 0 ... bins - 1 occurs in the flat int32 `values`: `bincount` on a CPU (the
    fastest there); elsewhere `_count_values_by_index_add` (a GPU's bincount synchronises to size
    its output)."""
    if values.device.type == "cpu":
        return torch.bincount(values, minlength=bins)
    return _count_values_by_index_add(values, bins)


def _count_values_by_index_add(values: torch.Tensor, bins: int) -> torch.Tensor:
    """`_count_values` without a host synchronisation: ones added at the values."""
    ones = torch.ones(1, dtype=torch.int64, device=values.device).expand(values.shape[0])
    return torch.zeros(bins, dtype=torch.int64, device=values.device).index_add_(0, values, ones)


def _equalize_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`equalize` on one chunk: per-channel histograms (one bincount of value + 256 * (sample,
    channel)), PIL's lookup tables from them, and one lookup (index_select) through the same index."""
    n, _, height, width = x.shape
    permutation = memory_permutation(x)
    index = scratch_like("work1", x, torch.int32).copy_(x)
    offsets = torch.arange(0, n * 3 * 256, 256, dtype=torch.int32, device=x.device)
    index.add_(row(offsets.view(n, 3), x, torch.int32))
    flat_index = index.permute(permutation).reshape(-1)
    hist = _count_values(flat_index, n * 3 * 256).view(n, 3, 256)
    cum_hist = hist.cumsum(dim=-1)
    last_value = cum_hist.argmax(dim=-1, keepdim=True)
    step = (height * width - hist.gather(-1, last_value)).div_(255, rounding_mode="floor")
    tables = (cum_hist[..., :-1] + step // 2).div_(step.clamp(min=1), rounding_mode="floor").clamp_(0, _MAX)
    tables = torch.cat([tables.new_zeros(n, 3, 1), tables], dim=-1)
    identity = torch.arange(256, device=x.device).expand(n, 3, 256)
    tables = torch.where(step != 0, tables, identity).to(torch.uint8)
    torch.index_select(tables.view(-1), 0, flat_index, out=out.permute(permutation).view(-1))


def equalize(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `equalize_image` (PIL's algorithm): each channel of each sample mapped through
    its cumulative histogram; a channel whose pixels but those of its highest value number fewer
    than 255 is left as it is."""
    return whole_batch(equalize, x)


def _gaussian_kernels(size: int, sigma: torch.Tensor) -> torch.Tensor:
    """torchvision's 1-D Gaussian kernel of `size` taps for each sigma (N,): (N, size) float32."""
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    taps = torch.linspace(-lim, lim, steps=size, dtype=torch.float32, device=sigma.device)
    return torch.softmax(taps.div(sigma.to(torch.float32).view(-1, 1)).pow(2).neg(), dim=1)


def _blur_into(x: torch.Tensor, sigma: torch.Tensor, out: torch.Tensor, kernel_size: tuple[int, int]) -> None:
    """`gaussian_blur` on one chunk: tap by tap, each a multiply-add of a shifted view with the
    per-sample weight spread over a row (NOTE [CPU speed] (2)); rows first, then columns."""
    n, _, height, width = x.shape
    nhwc = channels_innermost(x)
    size_x, size_y = kernel_size
    padded = reflect_pad(_float_copy(x), size_x // 2, size_y // 2)
    weights_x = _gaussian_kernels(size_x, sigma)
    weights_y = _gaussian_kernels(size_y, sigma)
    across = scratch("work2", (n, 3, padded.shape[2], width), torch.float32, x.device, nhwc)
    torch.mul(padded[..., :width], row(weights_x[:, 0], across), out=across)
    for tap in range(1, size_x):
        across.addcmul_(padded[..., tap : tap + width], row(weights_x[:, tap], across))
    blurred = scratch_like("work3", x, torch.float32)
    torch.mul(across[..., :height, :], row(weights_y[:, 0], out), out=blurred)
    for tap in range(1, size_y):
        blurred.addcmul_(across[..., tap : tap + height, :], row(weights_y[:, tap], out))
    store(blurred.round_(), out)


def gaussian_blur(x: torch.Tensor, kernel_size: tuple[int, int], sigma: torch.Tensor) -> torch.Tensor:
    """torchvision's `gaussian_blur_image(x, kernel_size, [s, s])` per sample: `kernel_size` is
    torchvision's (along the width, along the height), odd and positive; `sigma` (N,) > 0; reflect
    padding (each half-size must be less than the image's side); rounded back to uint8.

    Separable (a pass along rows, then one along columns) where torchvision convolves with the 2-D
    outer product of the same 1-D kernels: the same sum in another order, so a value can land on
    the other side of a rounding half: at most 1 apart, rarely (tests/test_augment_color.py).
    """
    return whole_batch(gaussian_blur, x, sigma, kernel_size=kernel_size)


CHUNKED_FORMS.update(
    {
        adjust_brightness: (_brightness_into, 4.5),
        adjust_contrast: (_contrast_into, 5.5),
        adjust_saturation: (_saturation_into, 8.5),
        adjust_hue: (_hue_into, _HUE_PLANES + 1.5),
        adjust_sharpness: (_sharpness_into, 7.5),
        rgb_to_grayscale: (_grayscale_into, 1.5),
        posterize: (_posterize_into, 0.5),
        solarize: (_solarize_into, 0.5),
        invert: (_invert_into, 0.5),
        autocontrast: (_autocontrast_into, 4.5),
        equalize: (_equalize_into, 3.0),
        gaussian_blur: (_blur_into, 6.0),  # keeps ~12, but its per-tap overhead wants larger chunks
    }
)
