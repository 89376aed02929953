//! The engine table's log: `(name, sequence hash)` entries in the order they were stored,
//! addressed by 32-bit positions that stay valid while the entry is in the log.
//!
//! Entries sit in fixed chunks of [`CHUNK`], so the log grows at its back and shrinks at its
//! front without moving anything, and its memory follows its length (a deque of plain
//! entries would double its buffer and copy). Each chunk carries a bit per entry for entries
//! removed since ("dead"), which stay in place until they reach the front or the log is
//! rewritten. A position is the entry's number since the log began, modulo 2^32; the log
//! never holds 2^32 entries (see `MAX_ENTRIES`), so a position names one entry.

/// Entries per chunk (16 KiB of entries and 128 bytes of dead bits).
const CHUNK: usize = 1024;

#[derive(Clone, Copy, Default)]
struct Cell {
    name: u64,
    seq: u64,
}

/// A chunk of entries and their dead bits, in one allocation.
struct Block {
    cells: [Cell; CHUNK],
    dead: [u64; CHUNK / 64],
}

/// A chunk as the log holds it.
type Chunk = Box<Block>;

impl Block {
    fn new() -> Chunk {
        Box::new(Block {
            cells: [Cell::default(); CHUNK],
            dead: [0; CHUNK / 64],
        })
    }

    const BYTES: usize = std::mem::size_of::<Block>();
}

/// The log. See the module documentation. Chunks past the last entry's (reserved ahead) are
/// used as the log grows.
#[derive(Default)]
pub(super) struct Log {
    /// The chunks, oldest first (a plain vector: the front one leaves once per [`CHUNK`]
    /// entries, when moving the others' pointers costs less than a deque's index arithmetic
    /// on every access).
    chunks: Vec<Chunk>,
    /// Where the first entry sits in the first chunk.
    head: usize,
    /// Entries, live and dead.
    len: usize,
    /// The position of the first entry.
    start: u32,
    /// A chunk dropped from the front, kept for the next one needed at the back (steady
    /// churn then allocates nothing).
    spare: Option<Chunk>,
}

impl Log {
    /// The chunk and the place in it of the entry at `pos`.
    #[inline]
    fn locate(&self, pos: u32) -> (usize, usize) {
        let rel = pos.wrapping_sub(self.start) as usize;
        debug_assert!(rel < self.len, "a position in the log");
        let i = self.head + rel;
        (i / CHUNK, i % CHUNK)
    }

    #[inline]
    fn cell(&self, pos: u32) -> Cell {
        let (c, o) = self.locate(pos);
        self.chunks[c].cells[o]
    }

    /// Entries, live and dead.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The name of the entry at `pos`.
    #[inline]
    pub fn name(&self, pos: u32) -> u64 {
        self.cell(pos).name
    }

    /// The sequence hash of the entry at `pos`.
    #[inline]
    pub fn seq(&self, pos: u32) -> u64 {
        self.cell(pos).seq
    }

    /// Marks the entry at `pos` dead.
    #[inline]
    pub fn kill(&mut self, pos: u32) {
        self.take(pos);
    }

    /// Marks the entry at `pos` dead; its sequence hash.
    #[inline]
    pub fn take(&mut self, pos: u32) -> u64 {
        let (c, o) = self.locate(pos);
        let chunk = &mut self.chunks[c];
        chunk.dead[o / 64] |= 1 << (o % 64);
        chunk.cells[o].seq
    }

    /// The position the next entry appended will have.
    #[inline]
    pub fn next_position(&self) -> u32 {
        self.start.wrapping_add(self.len as u32)
    }

    /// Appends an entry; its position.
    #[inline]
    pub fn push(&mut self, name: u64, seq: u64) -> u32 {
        let i = self.head + self.len;
        let (c, o) = (i / CHUNK, i % CHUNK);
        if c == self.chunks.len() {
            let chunk = self.spare.take().unwrap_or_else(Block::new);
            self.chunks.push(chunk);
        }
        let chunk = &mut self.chunks[c];
        chunk.cells[o] = Cell { name, seq };
        chunk.dead[o / 64] &= !(1 << (o % 64));
        let pos = self.next_position();
        self.len += 1;
        pos
    }

    /// Drops the first `n` entries (at most those left in the first chunk).
    fn advance(&mut self, n: usize) {
        debug_assert!(n <= self.len && self.head + n <= CHUNK);
        self.head += n;
        self.len -= n;
        self.start = self.start.wrapping_add(n as u32);
        if self.head == CHUNK {
            self.spare = Some(self.chunks.remove(0));
            self.head = 0;
        }
    }

    /// Drops the dead entries at the front, a word of dead bits at a time.
    #[inline]
    pub fn drop_dead_front(&mut self) {
        while self.len > 0 {
            let bit = self.head % 64;
            let dead = self.chunks[0].dead[self.head / 64] >> bit;
            let run = ((!dead).trailing_zeros() as usize)
                .min(64 - bit)
                .min(self.len);
            if run == 0 {
                return;
            }
            self.advance(run);
        }
    }

    /// Drops the dead entries at the front and then the first live one; its position, name
    /// and sequence hash.
    pub fn pop_live(&mut self) -> Option<(u32, u64, u64)> {
        self.drop_dead_front();
        if self.len == 0 {
            return None;
        }
        let pos = self.start;
        let cell = self.cell(pos);
        self.advance(1);
        Some((pos, cell.name, cell.seq))
    }

    /// `(name, sequence hash)` of the live entries, oldest first.
    pub fn live(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.len).filter_map(move |rel| {
            let i = self.head + rel;
            let chunk = &self.chunks[i / CHUNK];
            let o = i % CHUNK;
            let cell = chunk.cells[o];
            (chunk.dead[o / 64] & (1 << (o % 64)) == 0).then_some((cell.name, cell.seq))
        })
    }

    /// Allocates the chunks for `more` entries beyond those held (kept until used).
    pub fn reserve(&mut self, more: usize) {
        let need = (self.head + self.len + more).div_ceil(CHUNK);
        while self.chunks.len() < need {
            let chunk = self.spare.take().unwrap_or_else(Block::new);
            self.chunks.push(chunk);
        }
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        (self.chunks.len() + usize::from(self.spare.is_some())) * Block::BYTES
            + self.chunks.capacity() * std::mem::size_of::<Chunk>()
    }
}
