//! A layer's matrix as its model holds it: held for the run, or its place in the passes of a
//! [`LayerStream`], read when the layer computes with it. A model computes with either the same
//! way ([`Matrix::with`]), so the same layer code runs held and streamed.

use std::sync::Arc;

use minirun_kernels::{Format, QMatrix};

use crate::artifact::{ArtifactError, Stack, StackLayout};
use crate::layer_stream::LayerStream;
use crate::step::ModelError;

/// A matrix, or a stack of equally shaped matrices (attention heads), of one layer.
pub struct Matrix<'w> {
    format: Format,
    rows: usize,
    cols: usize,
    /// Matrices in the stack.
    len: usize,
    source: Source<'w>,
}

enum Source<'w> {
    Held(Stack<'w>),
    /// Read in each pass, at `index` of the stream's order.
    Streamed {
        stream: Arc<LayerStream<'w>>,
        index: usize,
    },
}

impl<'w> Matrix<'w> {
    pub(crate) fn held(stack: Stack<'w>) -> Matrix<'w> {
        Matrix {
            format: stack.format,
            rows: stack.rows,
            cols: stack.cols,
            len: stack.len(),
            source: Source::Held(stack),
        }
    }

    /// The matrix `layout` describes, at `index` of `stream`'s order.
    pub(crate) fn streamed(
        stream: Arc<LayerStream<'w>>,
        index: usize,
        layout: &StackLayout,
    ) -> Matrix<'w> {
        Matrix {
            format: layout.format,
            rows: layout.rows,
            cols: layout.cols,
            len: layout.parts.len(),
            source: Source::Streamed { stream, index },
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Matrices in the stack.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows of each matrix of the stack.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The matrix, where it is held for the run: what may compute outside a pass over the
    /// layers (a guess at a router's choice); `None` where it streams.
    pub fn held_matrix(&self) -> Option<QMatrix<'w>> {
        match &self.source {
            Source::Held(stack) => stack.get(0),
            Source::Streamed { .. } => None,
        }
    }

    /// `f` on the stack's matrices: held ones at once, a streamed one once the pass has read
    /// it (kept until the pass asks for a later matrix).
    pub fn with_stack<R, E>(
        &self,
        f: impl FnOnce(&Stack<'_>) -> Result<R, E>,
    ) -> Result<R, ModelError>
    where
        ModelError: From<E>,
    {
        match &self.source {
            Source::Held(stack) => Ok(f(stack)?),
            Source::Streamed { stream, index } => {
                let read = stream.read(*index)?;
                let layout = stream.layout(*index).ok_or_else(|| ArtifactError::Tensor {
                    name: format!("streamed matrix {index}"),
                    reason: "is not in its layer stream".into(),
                })?;
                Ok(f(&read.stack(layout)?)?)
            }
        }
    }

    /// `f` on the one matrix (of a stack of one), as [`Matrix::with_stack`].
    pub fn with<R, E>(&self, f: impl FnOnce(&QMatrix<'_>) -> Result<R, E>) -> Result<R, ModelError>
    where
        ModelError: From<E>,
    {
        self.with_stack::<R, ModelError>(|stack: &Stack<'_>| -> Result<R, ModelError> {
            match stack.get(0) {
                Some(m) if stack.len() == 1 => f(&m).map_err(ModelError::from),
                _ => Err(ModelError::Artifact(ArtifactError::Tensor {
                    name: "a layer's matrix".into(),
                    reason: format!("is a stack of {}, asked for as one matrix", stack.len()),
                })),
            }
        })
    }
}
