"""The kernels behind the transforms the decode does not fold in: batched torch operations with
per-sample parameters, the same code on the CPU (in workers, in place in the slot) and on the GPU
(after the copy). `program` is the seam the loader uses; `registry` holds every kernel by the
name a transform's declaration gives (NOTE [kernels by name] in `fastload.transforms._declare`);
`color_ops`, `policies`, `mixing`, `timm_ops` and `warp_ops` hold the operations, each in its
module's `KERNELS` (and `BATCH_KERNELS`) table.

It may import the transforms' declarations (`fastload.transforms`) and the foundations, never
the loader above it.

The modules:
- `ops`: the contract: `SampleOp` / `BatchOp`, the rules they keep, their parameters;
- `registry`: the one kernel registry (`sample_op`, `batch_op`, `check_kernels`,
  `register_kernel`); a kernel over its members' kernels is handed it, never imports it;
- `program`: the stages as the loader runs them (`SampleProgram`, `TrainerStages`), each transform's
  kernel from `registry`;
- `batching`: running kernels chunk by chunk at memory speed on a CPU: layout helpers, per-thread
  scratch memory, chunks kept in cache, `apply_kernel` (NOTE [CPU speed]);
- `color`: torchvision v2's photometric `*_image` kernels (brightness ... Gaussian blur, invert,
  equalize) with one parameter per sample;
- `color_ops`: the colour transforms' operations (ColorJitter, GaussianBlur, the random-apply
  ones), drawing their parameters and running `color`'s kernels;
- `affine`: the policies' geometric kernels (shears, translations, rotations), torchvision's
  `affine` / `rotate` pixel for pixel; any sampling grid through `grid_warp_`;
- `perspective`: RandomPerspective's corners, coefficients and grid, as torchvision computes them;
- `warp_ops`: the warps after the decode (RandomVerticalFlip, RandomRotation, RandomAffine,
  RandomPerspective), per-sample matrices run through `affine`;
- `spaces`: the policies' operation spaces, magnitude tables and AutoAugment's sub-policies;
- `draws`: Gamma, Dirichlet and Beta variates from a sample's own uniforms (AugMix's weights);
- `groups`: moving a group of samples out of a batch and back as whole rows (`take`, `put_`,
  `apply_to`);
- `policies`: RandAugment, TrivialAugmentWide, AutoAugment and AugMix, batched;
- `mixing`: the stages after normalization: RandomErasing per sample, MixUp / CutMix per batch;
- `timm_ops`: timm's RandAugment and Mixup, and RandomApply over its members' kernels.
"""
