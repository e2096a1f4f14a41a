# Guest: a script that runs longer than the boot is given (the test sets
# XIW_VM_BOOT_TIMEOUT to 60 s): run.sh's boot watchdog must leave it to
# finish, on the first boot.
# Prints "ok: ..." or "FAIL: ..." per check; exits with the failures.
. /lib.sh
check "ran for 90 s after init" "sleep 90"
exit $fails
