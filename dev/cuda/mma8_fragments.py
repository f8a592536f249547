"""Checks attn_mma8's (src/cuda/attn_mma8.cuh) register-fragment arithmetic for its 8-bit products without a GPU: one
warp's S = Q·Kᵀ on m16n8k32 and, for the fp8 mode, O += P·V with P packed from the S accumulators and V transposed
in attn_fp8_key's order, each operand read by ldmatrix from the XOR-swizzled tiles mma8_load writes. The same index
formulas as the kernel, on small integers (exact in doubles), against the plain products. The int8 mode's P·V in f16
is the bf16 flash kernel's (attn_fa2), already checked on GPUs.

PTX's fragment layouts used (ISA, "Matrix fragments for mma.m16n8k32"): a lane is groupID g = lane/4 and t4 = lane%4;
A regs a0..a3 hold rows g, g+8, g, g+8 at k = t4·4 + i (a2, a3: +16); B regs b0, b1 hold k = t4·4 + i (b1: +16) of
column g; C holds rows g (c0, c1) and g+8 (c2, c3) at columns t4·2, t4·2+1. ldmatrix.x4: lanes 8m..8m+7 give the row
addresses of matrix m; register m of a lane holds 32-bit word lane%4 of row lane/4.

    python3 dev/cuda/mma8_fragments.py        (prints ok or the first mismatch; exit status 0 or 1)"""
import random
import sys

random.seed(1)


def swz(r, c, ch):  # byte offset of 16-byte chunk c of row r, ch chunks a row (mma8_swz)
    return r * ch * 16 + ((c ^ (r & 7)) << 4)


def store(rows, ch):  # a [rows][ch·16] byte matrix into its swizzled tile (mma8_load)
    sm = [None] * (len(rows) * ch * 16)
    for r, row in enumerate(rows):
        for c in range(ch):
            o = swz(r, c, ch)
            sm[o:o + 16] = row[c * 16:(c + 1) * 16]
    return sm


def ldmatrix_x4(sm, addr):
    return [[sm[addr[8 * m + lane // 4] + 4 * (lane % 4):addr[8 * m + lane // 4] + 4 * (lane % 4) + 4]
             for lane in range(32)] for m in range(4)]


def mma_k32(a, b0, b1):  # a: 4 regs x 32 lanes of 4 values; returns C fragments [lane][4]
    A = [[0] * 32 for _ in range(16)]
    B = [[0] * 8 for _ in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            A[g][t * 4 + i], A[g + 8][t * 4 + i] = a[0][lane][i], a[1][lane][i]
            A[g][16 + t * 4 + i], A[g + 8][16 + t * 4 + i] = a[2][lane][i], a[3][lane][i]
            B[t * 4 + i][g], B[16 + t * 4 + i][g] = b0[lane][i], b1[lane][i]
    C = [[sum(A[r][k] * B[k][n] for k in range(32)) for n in range(8)] for r in range(16)]
    return [[C[lane // 4][lane % 4 * 2], C[lane // 4][lane % 4 * 2 + 1], C[lane // 4 + 8][lane % 4 * 2],
             C[lane // 4 + 8][lane % 4 * 2 + 1]] for lane in range(32)]


def fp8_key(c):  # attn_fp8_key (attn_kernels.cuh)
    h, i = c & 16, c & 15
    return h + 8 * ((i & 3) >> 1) + 2 * (i >> 2) + (i & 1)


def at(frag, j, lane, e):  # (row, column) of accumulator value e of lane in n-tile j
    return lane // 4 + (8 if e >= 2 else 0), j * 8 + lane % 4 * 2 + (e & 1)


def main():
    BQ, BK, D = 64, 128, 128
    Q = [[random.randint(-5, 5) for _ in range(D)] for _ in range(BQ)]
    K = [[random.randint(-5, 5) for _ in range(D)] for _ in range(BK)]
    V = [[random.randint(-4, 4) for _ in range(D)] for _ in range(BK)]
    Vt = [[V[(col & ~31) + fp8_key(col & 31)][d] for col in range(BK)] for d in range(D)]
    sQ, sK, sV = store(Q, 8), store(K, 8), store(Vt, 8)
    for warp in range(4):
        qf = [ldmatrix_x4(sQ, [swz(warp * 16 + (l & 15), kk * 2 + (l >> 4), 8) for l in range(32)]) for kk in range(4)]
        s = [[[0] * 4 for _ in range(32)] for _ in range(BK // 8)]
        for kk in range(4):
            for jj in range(BK // 16):
                b = ldmatrix_x4(sK, [swz(jj * 16 + (l & 7) + ((l >> 4) << 3), kk * 2 + ((l >> 3) & 1), 8)
                                     for l in range(32)])
                for j, b0, b1 in ((2 * jj, b[0], b[1]), (2 * jj + 1, b[2], b[3])):
                    c = mma_k32(qf[kk], b0, b1)
                    for lane in range(32):
                        for e in range(4):
                            s[j][lane][e] += c[lane][e]
        P = [[0] * BK for _ in range(16)]
        for j in range(BK // 8):
            for lane in range(32):
                for e in range(4):
                    r, key = at(s, j, lane, e)
                    want = sum(Q[warp * 16 + r][d] * K[key][d] for d in range(D))
                    if s[j][lane][e] != want:
                        print(f"S mismatch: warp {warp}, row {r}, key {key}: {s[j][lane][e]} != {want}")
                        return 1
                    P[r][key] = s[j][lane][e]
        o = [[[0] * 4 for _ in range(32)] for _ in range(16)]
        for kk in range(BK // 32):  # P packed as the kernel packs it (pack_e4m3x4's argument order)
            pa = [[[s[4 * kk + x][lane][y] for x, y in pairs] for lane in range(32)]
                  for pairs in (((0, 0), (0, 1), (1, 0), (1, 1)), ((0, 2), (0, 3), (1, 2), (1, 3)),
                                ((2, 0), (2, 1), (3, 0), (3, 1)), ((2, 2), (2, 3), (3, 2), (3, 3)))]
            for dd in range(8):
                b = ldmatrix_x4(sV, [swz(dd * 16 + (l & 7) + ((l >> 4) << 3), kk * 2 + ((l >> 3) & 1), 8)
                                     for l in range(32)])
                for i, b0, b1 in ((2 * dd, b[0], b[1]), (2 * dd + 1, b[2], b[3])):
                    c = mma_k32(pa, b0, b1)
                    for lane in range(32):
                        for e in range(4):
                            o[i][lane][e] += c[lane][e]
        for i in range(16):
            for lane in range(32):
                for e in range(4):
                    r, col = at(o, i, lane, e)
                    want = sum(P[r][k] * V[k][col] for k in range(BK))
                    if o[i][lane][e] != want:
                        print(f"P·V mismatch: warp {warp}, row {r}, channel {col}: {o[i][lane][e]} != {want}")
                        return 1
    print("mma8 fragments: S = Q·Kᵀ and the fp8 P·V match the plain products for all 4 warps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
