//! A borrowed row-major `[rows, cols]` matrix, the shape every batch entry point takes.

use crate::error::{Error, Result};

/// A row-major matrix borrowed from the caller (a numpy array, a C buffer, a `Vec`).
///
/// # Example
///
/// ```rust
/// use av_core::MatrixView;
///
/// // Two requests, three draft positions each.
/// let logits = vec![2.0f32, 0.5, -1.0, 3.0, 1.0, 0.0];
/// let m = MatrixView::new("features", &logits, 2, 3)?;
/// assert_eq!((m.rows(), m.cols()), (2, 3));
/// assert_eq!(m.data().len(), 6);
/// assert!(m.expect_cols("features", 3).is_ok());
/// assert_eq!(m.expect_rows("num_admitted", 4).unwrap_err().argument, "num_admitted");
/// # Ok::<(), av_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MatrixView<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
}

impl<'a, T> MatrixView<'a, T> {
    /// Wraps `data` as `[rows, cols]`; `argument` names it in the error if the length is wrong.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::MatrixView;
    ///
    /// let data = [0.9f64, 0.8, 0.7, 0.6];
    /// assert!(MatrixView::new("confidences", &data, 2, 2).is_ok());
    /// let err = MatrixView::new("confidences", &data, 3, 2).unwrap_err();
    /// assert_eq!(err.argument, "confidences");
    /// ```
    pub fn new(argument: &'static str, data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(Error::value(
                argument,
                format!(
                    "has {} elements, which is not the shape [{rows}, {cols}]",
                    data.len()
                ),
            ));
        }
        Ok(MatrixView { data, rows, cols })
    }

    /// Number of rows (requests).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (draft positions).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// All elements, row-major.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// Row `row` (panics if `row >= rows()`).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::MatrixView;
    ///
    /// let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    /// let m = MatrixView::new("features", &data, 3, 2)?;
    /// assert_eq!(m.row(1), &[3.0, 4.0]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn row(&self, row: usize) -> &'a [T] {
        &self.data[row * self.cols..(row + 1) * self.cols]
    }

    /// Fails unless the matrix has exactly `cols` columns.
    pub fn expect_cols(&self, argument: &'static str, cols: usize) -> Result<()> {
        if self.cols == cols {
            Ok(())
        } else {
            Err(Error::value(
                argument,
                format!(
                    "expected shape [R, {cols}], got [{}, {}]",
                    self.rows, self.cols
                ),
            ))
        }
    }

    /// Fails unless the matrix has exactly `rows` rows.
    pub fn expect_rows(&self, argument: &'static str, rows: usize) -> Result<()> {
        if self.rows == rows {
            Ok(())
        } else {
            Err(Error::value(
                argument,
                format!(
                    "expected {rows} rows to match the other arguments, got shape [{}, {}]",
                    self.rows, self.cols
                ),
            ))
        }
    }
}
