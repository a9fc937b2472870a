"""The kernels behind fastload's non-geometric transforms: batched torch operations with
per-sample parameters, the same code on the CPU (in workers, in place in the slot) and on the GPU
(after the copy). `program` is the seam the loader uses; `color_ops`, `policies` and `mixing` hold
the operations, each registered in its module's `OPS` by the transform type it runs.

The modules:
- `ops`: the contract: `SampleOp` / `BatchOp`, the rules they keep, their parameters;
- `program`: the stages as the loader runs them (`SampleProgram`, `TrainerStages`), each transform
  looked up in the modules' `OPS`;
- `batching`: running kernels chunk by chunk at memory speed on a CPU: layout helpers, per-thread
  scratch memory, chunks kept in cache, `apply_kernel` (NOTE [CPU speed]);
- `color`: torchvision v2's photometric `*_image` kernels (brightness ... Gaussian blur, invert,
  equalize) with one parameter per sample;
- `color_ops`: the colour transforms' operations (ColorJitter, GaussianBlur, the random-apply
  ones), drawing their parameters and running `color`'s kernels;
- `affine`: the policies' geometric kernels (shears, translations, rotations), torchvision's
  `affine` / `rotate` pixel for pixel;
- `spaces`: the policies' operation spaces, magnitude tables and AutoAugment's sub-policies;
- `draws`: Gamma, Dirichlet and Beta variates from a sample's own uniforms (AugMix's weights);
- `groups`: moving a group of samples out of a batch and back as whole rows (`take`, `put_`,
  `apply_to`);
- `policies`: RandAugment, TrivialAugmentWide, AutoAugment and AugMix, batched;
- `mixing`: the stages after normalization: RandomErasing per sample, MixUp / CutMix per batch.
"""
