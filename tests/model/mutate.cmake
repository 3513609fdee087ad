# mutate.cmake: makes DIR a copy of SRC (src/: every .c and .h) in which
# FILE carries one edit, as MUTANT says: the text between its "@@ from"
# and "@@ to" lines, found exactly once in FILE, is replaced by the text
# after "@@ to". The whole tree is copied so that every include of the
# file, from the test or from another header (which finds its neighbours
# in its own directory first), reaches the broken copy. Fails if the text
# is not in FILE once, so a broken variant never silently turns into the
# real code.
#   cmake -DMUTANT=m.mutant -DSRC=src -DDIR=build/x -DFILE=park.c \
#         -P mutate.cmake
file(READ ${MUTANT} m)
string(FIND "${m}" "\n@@ from\n" a)
string(FIND "${m}" "\n@@ to\n" b)
if(a LESS 0 OR b LESS a)
  message(FATAL_ERROR "${MUTANT}: want an '@@ from' then an '@@ to' line")
endif()
math(EXPR from_start "${a} + 9")
math(EXPR from_len "${b} + 1 - ${from_start}")
math(EXPR to_start "${b} + 7")
string(SUBSTRING "${m}" ${from_start} ${from_len} from)
string(SUBSTRING "${m}" ${to_start} -1 to)
file(REMOVE_RECURSE ${DIR})
file(GLOB tree ${SRC}/*.c ${SRC}/*.h)
file(COPY ${tree} DESTINATION ${DIR})
file(READ ${SRC}/${FILE} src)
string(FIND "${src}" "${from}" first)
string(FIND "${src}" "${from}" last REVERSE)
if(first LESS 0)
  message(FATAL_ERROR "${MUTANT}: its '@@ from' text is not in ${FILE}: "
                      "update the mutant to the source")
endif()
if(NOT first EQUAL last)
  message(FATAL_ERROR "${MUTANT}: its '@@ from' text is in ${FILE} twice")
endif()
string(REPLACE "${from}" "${to}" out "${src}")
file(WRITE ${DIR}/${FILE} "${out}")
file(WRITE ${DIR}/.stamp "")
