//! Strong id types.

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$m:meta])* $name:ident, $inner:ty) => {
        $(#[$m])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        pub struct $name(pub $inner);
        impl $name {
            #[inline]
            pub fn idx(self) -> usize {
                self.0 as usize
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A model served by a dispatcher (dense index into the dispatcher's models).
    ModelId,
    u32
);
id_type!(
    /// A GPU of a dispatcher (dense index; a lower id is preferred when several are free).
    GpuId,
    u32
);
id_type!(
    /// One inference request (task).
    TaskId,
    u64
);
id_type!(
    /// One batch plan sent to a backend.
    PlanId,
    u64
);
