//! Saving and loading planners and cost tables as bytes, from the core's persistence
//! (`av_core::persist`): the same frames the Python bindings write, so a state saved by one
//! loads in the other.

use crate::raw::{OutSlice, OutValue};
use crate::status::{FfiError, FfiResult, AVC_ERR_BUFFER_TOO_SMALL};

/// The save convention of every `avc_*_save`: the state's size to `len`, then the bytes to
/// `out` when its capacity `cap` is large enough; otherwise AVC_ERR_BUFFER_TOO_SMALL and
/// nothing written to `out`.
pub(crate) fn write_state(
    bytes: &[u8],
    out: OutSlice<'_, u8>,
    cap: usize,
    len: &OutValue<'_, usize>,
) -> FfiResult {
    let needed = bytes.len();
    len.write(needed);
    if cap < needed {
        return Err(FfiError {
            status: AVC_ERR_BUFFER_TOO_SMALL,
            message: format!(
                "buf: cap = {cap} bytes, the state needs {needed} (written to *len_out)"
            ),
        });
    }
    out.prefix(needed).write(bytes);
    Ok(())
}
