// Prelude joined before the attention kernels (forward, backward query side, backward
// key side): the shape they share (rusting_brain_core::ops::attention::AttentionSpec) and
// the bindings of q, k and v.

