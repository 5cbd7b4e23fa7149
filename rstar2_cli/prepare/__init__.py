"""`rstar2 prepare`'s jobs that roll out a policy: the stage-3 hard subset (mine_hard.py), from the
eval runner's rollouts. The jobs that only read and write problem files (the training set, the SFT
conversion, the hard-subset selection) are in data/, a leaf floor that no engine reaches."""
