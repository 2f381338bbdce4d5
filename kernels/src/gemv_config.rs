//! [`GemvConfig`]: how a GEMV launch maps units onto rows, which variant each device gets,
//! and the pass widths (shaders) of each.
use crate::{
    MAX_GEMV_ROWS, MAX_OWN_ROWS_PLANE, gemv, is_software_device, plane_ops, shared_memory_ok,
};
use cubecl::client::Client;
use cubecl::features::Plane;
use cubecl::prelude::*;

/// How a GEMV launch maps units onto rows (the two layouts of [`gemv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemvConfig {
    /// `lanes` units share each output row, `rows_per_cube` rows per cube; partials are
    /// reduced with a plane sum (`plane`: `lanes` is the device's plane width) or through
    /// shared memory (`lanes == 1`: no reduction). The GPU layout: neighbouring lanes read
    /// neighbouring chunks of a row.
    Split {
        /// Units per output row.
        lanes: u32,
        /// Output rows per cube.
        rows_per_cube: u32,
        /// Reduce with a plane sum (else through shared memory).
        plane: bool,
    },
    /// Each of the `lanes` units of a cube owns `rows_per_unit` whole rows, stages each block
    /// once with vector loads and loads each activation once for all of them; with `plane` the
    /// cube is one plane (`lanes` is the device's plane width, at most
    /// [`MAX_OWN_ROWS_PLANE`]) whose lanes share their activation loads through plane
    /// broadcasts. The layout of CPU-emulated devices (lavapipe), where each per-lane load
    /// costs a scalar loop over the SIMD lanes and arithmetic is cheap.
    OwnRows {
        /// Whole rows each unit owns.
        rows_per_unit: u32,
        /// Units per cube.
        lanes: u32,
        /// The cube is one plane sharing activation loads by broadcasts.
        plane: bool,
    },
}

impl GemvConfig {
    /// The variant for this device:
    /// - a software device (no physical card, e.g. lavapipe):
    ///   [`GemvConfig::OwnRows`] with 8 rows per unit, sharing activations across a plane
    ///   when the device's plane width is fixed and at most [`MAX_OWN_ROWS_PLANE`] (lavapipe
    ///   on AVX2: 8, its SIMD width) and it runs plane ops ([`plane_ops`]: lavapipe does,
    ///   a browser's SwiftShader does not);
    /// - a GPU with plane ops and a fixed plane width (a power of two up to 32): a plane per
    ///   row with a plane sum;
    /// - otherwise 8 lanes per row with a shared-memory reduction, except on CubeCL's SPIR-V
    ///   path, whose shared-memory kernels fail `spirv-val`: one unit per row there.
    pub fn for_client(client: &Client) -> Self {
        let props = client.properties();
        let hw = &props.hardware;
        let fixed = hw.plane_size_min == hw.plane_size_max
            && hw.plane_size_max.is_power_of_two()
            && hw.plane_size_max <= 32;
        if is_software_device(client) {
            let width = hw.plane_size_max;
            if fixed && (2..=MAX_OWN_ROWS_PLANE).contains(&width) && plane_ops(client) {
                GemvConfig::OwnRows {
                    rows_per_unit: 8,
                    lanes: width,
                    plane: true,
                }
            } else {
                Self::OWN_ROWS
            }
        } else if let Some(plane) = Self::plane_split(client).filter(|_| fixed) {
            plane
        } else if shared_memory_ok(client) {
            Self::SHARED
        } else {
            Self::ROW_PER_UNIT
        }
    }

    /// The split variant with a plane per row and a plane sum, where `client` has plane ops of
    /// one fixed width (`lanes`): up to 256 units, at most 8 rows, per cube.
    fn plane_split(client: &Client) -> Option<GemvConfig> {
        let hw = &client.properties().hardware;
        let lanes = hw.plane_size_max;
        (client.features().plane.contains(Plane::Ops) && hw.plane_size_min == lanes).then_some(
            GemvConfig::Split {
                lanes,
                rows_per_cube: (256 / lanes).clamp(1, 8),
                plane: true,
            },
        )
    }

    /// One unit per row, 64 rows per cube, no staging.
    pub const ROW_PER_UNIT: GemvConfig = GemvConfig::Split {
        lanes: 1,
        rows_per_cube: 64,
        plane: false,
    };
    /// 8 lanes per row reduced in shared memory, 8 rows per cube.
    pub const SHARED: GemvConfig = GemvConfig::Split {
        lanes: 8,
        rows_per_cube: 8,
        plane: false,
    };
    /// 8 lanes per row reduced in shared memory, one row per cube (wide rows; many cubes).
    pub const SHARED_ONE_ROW: GemvConfig = GemvConfig::Split {
        lanes: 8,
        rows_per_cube: 1,
        plane: false,
    };
    /// Own rows, 8 per unit, 8 units per cube, no plane ops: runs on every device.
    pub const OWN_ROWS: GemvConfig = GemvConfig::OwnRows {
        rows_per_unit: 8,
        lanes: 8,
        plane: false,
    };

    /// The variants `device` can run: [`Self::ROW_PER_UNIT`], [`Self::OWN_ROWS`],
    /// [`Self::SHARED`] and [`Self::SHARED_ONE_ROW`] (not on the SPIR-V path), the plane
    /// split variant where the device has plane ops with a fixed width, and the variant
    /// [`Self::for_client`] picks.
    pub fn variants(client: &Client) -> Vec<GemvConfig> {
        let mut v = vec![Self::ROW_PER_UNIT, Self::OWN_ROWS];
        if shared_memory_ok(client) {
            v.extend([Self::SHARED, Self::SHARED_ONE_ROW]);
        }
        v.extend(Self::plane_split(client));
        let chosen = Self::for_client(client);
        if !v.contains(&chosen) {
            v.push(chosen);
        }
        v
    }

    /// The rows the unrolled code of one pass holds for `m` activation rows (the kernels'
    /// comptime `m_pass`; each value is one shader): the split layout takes all rows in one
    /// pass, padded to a power of two (1, 2, 4, 8: on a GPU the padding costs arithmetic, not
    /// weight reads); own rows take one row alone, else passes of [`gemv::OWN_ROWS_M`].
    pub fn pass_rows(self, m: usize) -> u32 {
        let m = m.clamp(1, MAX_GEMV_ROWS) as u32;
        match self {
            GemvConfig::Split { .. } => m.next_power_of_two(),
            GemvConfig::OwnRows { .. } if m == 1 => 1,
            GemvConfig::OwnRows { .. } => gemv::OWN_ROWS_M,
        }
    }

    /// Every distinct [`Self::pass_rows`] for `1..=MAX_GEMV_ROWS`: the shaders of this variant.
    pub fn pass_widths(self) -> Vec<u32> {
        let mut v: Vec<u32> = (1..=MAX_GEMV_ROWS).map(|m| self.pass_rows(m)).collect();
        v.dedup();
        v
    }

    /// The activation row counts that exercise every code path of this variant: for each
    /// pass width a full pass, one with padded rows where there is one (split: 1, 2, 3, 4, 5,
    /// 8; own rows: 1, 4, 5 and 8, several passes).
    pub fn test_rows(self) -> Vec<usize> {
        let mut v: Vec<usize> = match self {
            GemvConfig::Split { .. } => self
                .pass_widths()
                .into_iter()
                .flat_map(|p| [p as usize / 2 + 1, p as usize])
                .collect(),
            GemvConfig::OwnRows { .. } => {
                let g = gemv::OWN_ROWS_M as usize;
                vec![1, g, g + 1, MAX_GEMV_ROWS]
            }
        };
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The cube shape of a launch.
    pub fn cube_dim(self) -> CubeDim {
        match self {
            GemvConfig::Split {
                lanes,
                rows_per_cube,
                ..
            } => CubeDim::new_2d(lanes, rows_per_cube),
            GemvConfig::OwnRows { lanes, .. } => CubeDim::new_1d(lanes),
        }
    }

    /// Output rows one cube computes.
    pub fn rows_per_cube(self) -> u32 {
        match self {
            GemvConfig::Split { rows_per_cube, .. } => rows_per_cube,
            GemvConfig::OwnRows {
                rows_per_unit,
                lanes,
                ..
            } => lanes * rows_per_unit,
        }
    }

    /// The kernel's comptime layout arguments `(lanes, rows_per_cube, plane)` of
    /// `gemv::gemv()` (split) or `(lanes, rows_per_unit, plane)` of `gemv::gemv_rows()` (own
    /// rows).
    pub fn kernel_args(self) -> (u32, u32, bool) {
        match self {
            GemvConfig::Split {
                lanes,
                rows_per_cube,
                plane,
            } => (lanes, rows_per_cube, plane),
            GemvConfig::OwnRows {
                rows_per_unit,
                lanes,
                plane,
            } => (lanes, rows_per_unit, plane),
        }
    }

    /// A short name: `split-l8-r8-smem`, `split-l32-r8-plane` (lanes per row, rows per cube),
    /// `own-r8-l8-plane`, `own-r8-l8` (rows per unit, lanes per cube).
    pub fn name(self) -> String {
        match self {
            GemvConfig::Split {
                lanes,
                rows_per_cube,
                plane,
            } => format!(
                "split-l{lanes}-r{rows_per_cube}-{}",
                if plane { "plane" } else { "smem" }
            ),
            GemvConfig::OwnRows {
                rows_per_unit,
                lanes,
                plane,
            } => format!(
                "own-r{rows_per_unit}-l{lanes}{}",
                if plane { "-plane" } else { "" }
            ),
        }
    }
}

impl std::str::FromStr for GemvConfig {
    type Err = String;

    /// Parses [`GemvConfig::name`]'s form (`split-l8-r8-smem`, `split-l32-r8-plane`,
    /// `own-r8-l8-plane`, `own-r8-l8`), and the aliases `row-per-unit`, `shared`, `shared-one-row` and `own-rows`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown GEMV variant '{s}' (split-l<lanes>-r<rows per cube>-smem|plane, \
                 own-r<rows per unit>-l<lanes>[-plane], row-per-unit, shared, shared-one-row, \
                 own-rows)"
            )
        };
        let num = |part: Option<&str>, prefix: char| -> Result<u32, String> {
            part.and_then(|p| p.strip_prefix(prefix))
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| (1..=1024).contains(n))
                .ok_or_else(bad)
        };
        match s {
            "row-per-unit" => return Ok(Self::ROW_PER_UNIT),
            "shared" => return Ok(Self::SHARED),
            "shared-one-row" => return Ok(Self::SHARED_ONE_ROW),
            "own-rows" => return Ok(Self::OWN_ROWS),
            _ => {}
        }
        let mut parts = s.split('-');
        let config = match parts.next() {
            Some("split") => {
                let lanes = num(parts.next(), 'l')?;
                let rows_per_cube = num(parts.next(), 'r')?;
                let plane = match parts.next() {
                    Some("plane") => true,
                    Some("smem") => false,
                    _ => return Err(bad()),
                };
                GemvConfig::Split {
                    lanes,
                    rows_per_cube,
                    plane,
                }
            }
            Some("own") => GemvConfig::OwnRows {
                rows_per_unit: num(parts.next(), 'r')?,
                lanes: num(parts.next(), 'l')?,
                plane: match parts.next() {
                    Some("plane") => true,
                    None => false,
                    Some(_) => return Err(bad()),
                },
            },
            _ => return Err(bad()),
        };
        match parts.next() {
            None => Ok(config),
            Some(_) => Err(bad()),
        }
    }
}
